"""The pool's check before lending a connection (hub/lib/db_pool.py), on the real Postgres."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg_pool import ConnectionPool

from hub.lib import db_pool
from tests.support.polling import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def pool() -> Iterator[ConnectionPool[Any]]:
    params = connection.get_connection_params()
    params["autocommit"] = True
    lending = ConnectionPool(
        kwargs=params, min_size=1, max_size=1, check=db_pool.check_unless_recent, open=True
    )
    try:
        yield lending
    finally:
        lending.close()


def _backend_pid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def test_a_connection_lent_a_moment_ago_is_lent_again_without_a_round_trip(
    pool: ConnectionPool[Any],
) -> None:
    with pool.connection() as conn:  # the first lending of it: checked
        first = _backend_pid(conn)
    skipped = db_pool.skipped
    with pool.connection() as conn:
        assert _backend_pid(conn) == first
    assert db_pool.skipped == skipped + 1


def test_a_connection_the_server_ended_is_replaced_however_recently_it_was_lent(
    pool: ConnectionPool[Any],
) -> None:
    with pool.connection() as conn:
        doomed = _backend_pid(conn)
        socket = conn.pgconn.socket
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [doomed])
    # The server's goodbye (an error message, then EOF) reaches the idle socket: wait for it,
    # as a restart's would have arrived before the next request.
    wait_for(
        lambda: db_pool._has_input_fd(socket),
        timeout_s=10,
        interval_s=0.01,
        what="the terminated backend's socket to get readable",
    )
    with pool.connection() as conn:
        assert _backend_pid(conn) != doomed  # a new connection, not a failed query


def test_after_recent_s_the_round_trip_is_made_again() -> None:
    checked: list[object] = []
    clock = [100.0]

    class Conn:
        closed = broken = False

    conn: Any = Conn()
    db_pool.check_unless_recent(conn, clock=lambda: clock[0], full_check=checked.append)
    assert checked == [conn]
    clock[0] += 2.0
    db_pool.check_unless_recent(conn, clock=lambda: clock[0], full_check=checked.append)
    assert checked == [conn, conn]
