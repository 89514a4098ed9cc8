"""The psycopg_pool (and Django pool) internals the hub relies on (hub/lib/db_pool.py).

Pins: ``psycopg-pool==3.3.3`` and ``Django`` (requirements/hub.txt). A release that changes one
of these breaks tests/hub/test_compat_psycopg_pool.py, whose failures name what to re-check.

``ConnectionPool._check`` (private)
    The callable a pool runs on a connection before lending it. Django 5.2 builds the pool
    itself (``DatabaseWrapper.pool``) and always passes ``check=`` (psycopg_pool's
    ``check_connection`` with CONN_HEALTH_CHECKS, else None), so ``OPTIONS["pool"]`` cannot
    name another check: a second ``check`` is a TypeError. The hub swaps the attribute on the
    pool Django built instead. Upstream: no Django ticket offers a pool check of one's own
    (Django's pool support, ticket #33497, passes its own); none fits.

``DatabaseWrapper.pool`` (public property of Django's postgresql backend, documented with
``OPTIONS["pool"]``)
    The process's pool for a connection alias, or None without pooling.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def pool_of(connection: Any) -> Any:
    """Django's pool behind ``connection`` (a DatabaseWrapper), or None."""
    return getattr(connection, "pool", None)


def check_of(pool: Any) -> Callable[[Any], None] | None:
    return getattr(pool, "_check", None)


def set_check(pool: Any, check: Callable[[Any], None]) -> None:
    pool._check = check
