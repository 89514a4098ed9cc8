"""Rows and keys of finished leases do not pile up (issue 23): commands are pruned after the
retention window in bounded batches, and ended leases' live-log backlogs leave Redis."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from hub.celery import app as celery_app
from hub.leases import logs as lease_logs
from hub.leases import retention, services
from hub.leases.models import Command, Lease
from hub.suppliers import liveness
from hub.suppliers.models import Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _own_redis_keys() -> Iterator[None]:
    with f.private_redis_keys():
        yield


def _ended(host: Host, days_ago: float) -> Lease:
    """A lease run, released and acked, whose end lies ``days_ago`` back."""
    lease = f.run_lease(host)
    services.release_lease(lease.pk)
    assert f.ack(f.command_of(lease, Command.Kind.RELEASE))
    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED
    Lease.objects.filter(pk=lease.pk).update(ended_at=timezone.now() - timedelta(days=days_ago))
    return lease


def test_commands_of_leases_ended_before_the_window_are_deleted_and_no_others() -> None:
    old = _ended(f.register_host(), settings.COMMAND_RETENTION_DAYS + 1)
    recent = _ended(f.register_host(), settings.COMMAND_RETENTION_DAYS - 1)
    running = f.run_lease(f.register_host())
    Command.objects.filter(lease=running).update(created_at=timezone.now() - timedelta(days=365))
    assert old.commands.count() == 3

    assert retention.prune_commands() == 3

    assert not old.commands.exists()
    assert recent.commands.count() == 3
    assert running.commands.count() == 2
    assert Lease.objects.filter(pk=old.pk).exists()  # the lease row stays the record


def test_a_failed_lease_still_holding_gpus_keeps_its_commands() -> None:
    lease = f.start_lease(f.register_host())
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    assert f.ack(f.command_of(lease, Command.Kind.DOCKER_RUN), ok=False, error="no such image")
    lease.refresh_from_db()
    assert lease.state == Lease.State.FAILED  # its release is not acked: GPUs still granted
    Lease.objects.filter(pk=lease.pk).update(ended_at=timezone.now() - timedelta(days=400))

    assert retention.prune_commands() == 0
    assert lease.commands.count() == 3


def test_pruning_works_in_bounded_batches_and_goes_on_next_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = f.register_host()
    leases = [_ended(host, settings.COMMAND_RETENTION_DAYS + 2) for _ in range(3)]
    monkeypatch.setattr(retention, "PRUNE_BATCH", 2)
    monkeypatch.setattr(retention, "PRUNE_BATCHES", 2)

    assert retention.prune_commands() == 4
    assert retention.prune_commands() == 4
    assert retention.prune_commands() == 1
    assert retention.prune_commands() == 0
    assert not Command.objects.filter(lease__in=leases).exists()


def test_an_ended_leases_backlog_leaves_redis_after_the_grace() -> None:
    host = f.register_host()
    gone = _ended(host, 0)
    fresh = _ended(host, 0)
    now = timezone.now()
    grace = timedelta(seconds=settings.LOG_BACKLOG_AFTER_END_S)
    Lease.objects.filter(pk=gone.pk).update(ended_at=now - grace - timedelta(minutes=5))
    Lease.objects.filter(pk=fresh.pk).update(ended_at=now - grace + timedelta(minutes=5))
    client = liveness.sync_client()
    for lease in (gone, fresh):
        client.rpush(lease_logs.backlog_key(str(lease.pk)), '{"seq": 1, "data": "x"}')

    retention.drop_ended_backlogs(now)

    assert not client.exists(lease_logs.backlog_key(str(gone.pk)))
    assert client.exists(lease_logs.backlog_key(str(fresh.pk)))


def test_the_task_is_registered_and_scheduled() -> None:
    entry = settings.CELERY_BEAT_SCHEDULE["prune-commands"]
    assert entry["task"] == "leases.prune_commands"
    assert "leases.prune_commands" in celery_app.tasks
    assert retention.prune_commands_task.run() == 0
