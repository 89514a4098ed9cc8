"""Another platform's process on a rented GPU: the lease and the GPU are flagged together, on the
real database, so no reader (renter's lease page, admin's GPU list) sees one without the other."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection

from hub.agents import heartbeats
from hub.leases.models import Lease
from hub.suppliers.models import Gpu
from tests.hub import factories as f
from tests.support.polling import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _blocked_on_a_lock(probe: psycopg.Connection, pid: int) -> bool:
    row = probe.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"


def test_while_the_gpu_row_is_busy_nobody_sees_the_lease_flagged_alone() -> None:
    host = f.register_host()
    lease = f.run_lease(host)
    found = {str(lease.pk): [heartbeats.ForeignProcess(0, 999_999, "crypto-miner")]}
    gpu = Gpu.objects.get(host=host, index=0)
    flagger_pid: list[int] = []
    errors: list[BaseException] = []

    def flag() -> None:
        try:
            # django.db.connection is per thread: this is the flagger's own connection.
            connection.ensure_connection()
            flagger_pid.append(connection.connection.info.backend_pid)
            heartbeats.flag_foreign_processes(host.pk, found)
        except BaseException as exc:  # the test thread reports it
            errors.append(exc)
        finally:
            connection.close()

    with (
        psycopg.connect(**connection.get_connection_params(), autocommit=False) as holder,
        psycopg.connect(**connection.get_connection_params(), autocommit=True) as reader,
    ):
        # Another transaction holds the GPU row: the flagger waits on it mid-way.
        holder.execute("SELECT 1 FROM suppliers_gpu WHERE id = %s FOR UPDATE", (gpu.pk,))
        thread = threading.Thread(target=flag, daemon=True)
        thread.start()
        wait_for(lambda: flagger_pid, timeout_s=30, what="the flagger's connection")
        wait_for(
            lambda: _blocked_on_a_lock(reader, flagger_pid[0]),
            timeout_s=30,
            what="the flagger to wait on the GPU row",
        )
        lease_flag = reader.execute(
            "SELECT foreign_process_seen_at FROM leases_lease WHERE id = %s", (lease.pk,)
        ).fetchone()
        assert lease_flag == (None,), "the lease was flagged before its GPU"
        holder.rollback()
        thread.join(timeout=30)
    assert not errors, errors
    assert Lease.objects.get(pk=lease.pk).foreign_process_seen_at is not None
    assert Gpu.objects.get(pk=gpu.pk).foreign_process_seen_at is not None
