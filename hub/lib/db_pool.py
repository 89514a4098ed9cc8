"""The check the database pool runs on a connection before lending it: ``check_unless_recent``,
put on the pool Django built by ``use_on_pool_of`` (a ``connection_created`` receiver that
hub.accounts connects; Django passes its own check and takes no other, see
hub/lib/compat_psycopg_pool.py).

psycopg_pool's own ``check_connection`` sends an empty query: a round trip to Postgres on every
checkout, so that a connection a Postgres restart broke is replaced instead of failing a
request. The web process returns its connection after every socket message and request
(CONN_MAX_AGE 0), so in a reconnect storm each token check and registration batch paid that
round trip on top of its own queries (docs/benchmarks.md, issue 18: 2-7 ms each on the loaded
VM). Here the round trip is skipped for a connection this process lent less than ``RECENT_S``
ago, unless its socket has something to read: a server that ends a session (a restart, a
terminated backend, an idle timeout) sends an error message and closes the socket, which makes
it readable. What is left unchecked is a connection lost without a word in the last
``RECENT_S`` (a network partition): its next query fails once, as it would if it broke just
after a check. The pool lends its idle connections in turn (first returned, first lent): in a
storm each is lent again within milliseconds, while at a trickle the empty query still runs.

Django-free: psycopg and the standard library only.
"""

from __future__ import annotations

import select
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from psycopg import Connection
from psycopg_pool import ConnectionPool

from hub.lib import compat_psycopg_pool

RECENT_S = 2.0

_lock = threading.Lock()
_lent_at: weakref.WeakKeyDictionary[Connection[Any], float] = weakref.WeakKeyDictionary()
# Round trips saved, per process (the benchmark reads it from a profile; nothing exports it).
skipped = 0


def _has_input_fd(fd: int) -> bool:
    """Whether the server sent something the client has not read (poll, not select: a web
    process with 10,000 sockets has descriptors past select's 1024)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(poller.poll(0))


def check_unless_recent(
    conn: Connection[Any],
    *,
    recent_s: float = RECENT_S,
    clock: Callable[[], float] = time.monotonic,
    full_check: Callable[[Connection[Any]], None] = ConnectionPool.check_connection,
) -> None:
    """psycopg_pool's ``check``: return quietly if ``conn`` may be lent, raise otherwise."""
    global skipped
    now = clock()
    with _lock:
        lent_at = _lent_at.get(conn)
    if (
        lent_at is None
        or now - lent_at >= recent_s
        or conn.closed
        or conn.broken
        or _has_input_fd(conn.pgconn.socket)
    ):
        full_check(conn)  # raises for a broken connection: the pool replaces it
    else:
        skipped += 1
    with _lock:
        _lent_at[conn] = now


def use_on_pool_of(sender: object, connection: object, **kwargs: object) -> None:
    """``connection_created`` receiver: from the process's first connection on, its pool lends
    with ``check_unless_recent``. Nothing without a pool (DATABASE_POOL_MAX_SIZE=0): there
    Django's own check (CONN_HEALTH_CHECKS) runs."""
    pool = compat_psycopg_pool.pool_of(connection)
    if pool is not None and compat_psycopg_pool.check_of(pool) is not check_unless_recent:
        compat_psycopg_pool.set_check(pool, check_unless_recent)
        lent = getattr(connection, "connection", None)  # checked by the pool's own, just now
        if isinstance(lent, Connection):
            with _lock:
                _lent_at[lent] = time.monotonic()
