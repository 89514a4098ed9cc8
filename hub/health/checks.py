"""Reachability checks for the services the hub cannot work without."""

from __future__ import annotations

import redis
from django.conf import settings
from django.db import connections
from django.db.utils import Error as DatabaseError

# A health probe must answer fast even when a dependency hangs.
CHECK_TIMEOUT_S = 2.0


def check_postgres() -> str | None:
    """None when Postgres answers, else why not."""
    try:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return _first_line(exc)
    return None


def check_redis() -> str | None:
    """None when Redis answers PING, else why not."""
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=CHECK_TIMEOUT_S,
        socket_timeout=CHECK_TIMEOUT_S,
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return _first_line(exc)
    finally:
        client.close()
    return None


def _first_line(exc: BaseException) -> str:
    # Driver errors can span lines and repeat the DSN; the first line says enough.
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'no detail'}"
