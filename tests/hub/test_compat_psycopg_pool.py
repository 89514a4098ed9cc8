"""The psycopg_pool and Django internals hub.lib.compat_psycopg_pool relies on still exist with
their shape. Each failure names what to re-check when psycopg-pool or Django moves."""

from __future__ import annotations

import inspect

import django
import psycopg_pool
from django.db.backends.postgresql.base import DatabaseWrapper
from psycopg_pool import ConnectionPool

from hub.lib import compat_psycopg_pool


def _recheck(what: str) -> str:
    return (
        f"psycopg-pool {psycopg_pool.__version__} / Django {django.__version__}: {what} "
        "changed; re-check hub/lib/compat_psycopg_pool.py and hub/lib/db_pool.py"
    )


def test_a_pool_still_keeps_its_check_in_a_private_attribute_it_calls() -> None:
    def mine(conn: object) -> None:
        pass

    pool: ConnectionPool = ConnectionPool("", open=False, check=mine)
    assert compat_psycopg_pool.check_of(pool) is mine, _recheck("ConnectionPool._check")
    source = inspect.getsource(ConnectionPool._check_connection)
    assert "self._check(conn)" in source, _recheck("ConnectionPool._check_connection")


def test_django_still_builds_the_pool_with_a_check_of_its_own() -> None:
    # If Django ever takes a check from OPTIONS["pool"], pass db_pool's there instead.
    source = inspect.getsource(DatabaseWrapper.pool.fget)  # type: ignore[attr-defined]
    assert "check=ConnectionPool.check_connection if enable_checks else None" in source, _recheck(
        "DatabaseWrapper.pool's check"
    )
