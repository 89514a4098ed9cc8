from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from hub.leases import services, tasks
from hub.leases.models import Command, Lease, LeaseGpu
from hub.suppliers.models import Gpu, Host
from supplier_agent.protocol import (
    HUB_TO_AGENT,
    Ack,
    ContainerExited,
    DockerRun,
    Release,
    Reserve,
    parse_message,
)
from tests.hub import factories as f

State = Lease.State
Kind = Command.Kind


def _granted(lease: Lease) -> bool:
    return LeaseGpu.objects.filter(lease=lease, active=True).exists()


def _pending(lease: Lease) -> list[Command]:
    return list(lease.commands.filter(state__in=[Command.State.QUEUED, Command.State.SENT]))


def _parse(command: Command) -> Any:
    return parse_message(json.dumps(command.payload), allowed=HUB_TO_AGENT)


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def host(db: None) -> Host:
    return f.register_host(gpus=[0, 1])


@pytest.fixture
def starting(host: Host) -> Lease:
    lease = f.start_lease(host)
    assert f.ack(f.command_of(lease, Kind.RESERVE), result={"gpu_indices": [0]})
    lease.refresh_from_db()
    assert lease.state == State.STARTING
    return lease


@pytest.fixture
def running(host: Host) -> Lease:
    return f.run_lease(host)


# --- start_lease --------------------------------------------------------------------------------


def test_start_lease_reserves_with_one_queued_reserve_command(host: Host) -> None:
    lease = f.start_lease(host, [1, 0])

    assert lease.state == State.RESERVING
    assert set(lease.gpus.values_list("index", flat=True)) == {0, 1}
    assert LeaseGpu.objects.filter(lease=lease, active=True).count() == 2
    command = lease.commands.get()
    assert (command.kind, command.state, command.attempts) == (Kind.RESERVE, "queued", 0)
    assert command.host_id == host.pk
    reserve = _parse(command)
    assert isinstance(reserve, Reserve)
    assert reserve.command_id == str(command.id)
    assert reserve.lease_id == str(lease.id)
    assert reserve.epoch == lease.epoch
    assert reserve.selector == (0, 1)


def test_start_lease_gives_the_reserve_its_deadline(host: Host) -> None:
    before = timezone.now()
    lease = f.start_lease(host)
    command = lease.commands.get()
    budget = timedelta(seconds=settings.COMMAND_DEADLINES_S["reserve"])
    assert before + budget <= command.deadline <= timezone.now() + budget
    assert command.next_attempt_at <= timezone.now()


def test_start_lease_keeps_the_renters_spec(host: Host) -> None:
    lease = f.start_lease(host, image="pytorch/pytorch:2.5.1", ports=[8888], env={"A": "1"})
    lease.refresh_from_db()
    assert (lease.image, lease.ports, lease.env) == ("pytorch/pytorch:2.5.1", [8888], {"A": "1"})


def test_start_lease_refuses_an_offline_host(host: Host) -> None:
    f.take_offline(host)
    with pytest.raises(services.LeaseError, match="offline"):
        f.start_lease(host)
    assert not Lease.objects.exists()


def test_start_lease_refuses_a_host_in_maintenance(host: Host) -> None:
    Host.objects.filter(pk=host.pk).update(maintenance=True)  # an admin's switch, no service
    with pytest.raises(services.LeaseError, match="maintenance"):
        f.start_lease(host)
    assert not Lease.objects.exists()


def test_start_lease_refuses_an_unlisted_gpu(host: Host) -> None:
    Gpu.objects.filter(host=host, index=1).update(listed=False)  # the supplier's switch
    with pytest.raises(services.LeaseError, match="not for rent"):
        f.start_lease(host, [0, 1])
    assert not Lease.objects.exists()
    assert not LeaseGpu.objects.exists()


def test_start_lease_refuses_a_gpu_the_host_no_longer_reports(host: Host) -> None:
    f.register_host(host.token, agent_id=str(host.agent_id), gpus=[0])
    with pytest.raises(services.LeaseError, match="not for rent"):
        f.start_lease(host, [1])
    assert not Lease.objects.exists()


def test_start_lease_refuses_an_unknown_gpu_index(host: Host) -> None:
    with pytest.raises(services.LeaseError, match="does not have"):
        f.start_lease(host, [0, 7])
    assert not Lease.objects.exists()


def test_start_lease_refuses_duplicate_indices(host: Host) -> None:
    with pytest.raises(services.LeaseError, match="distinct"):
        f.start_lease(host, [0, 0])
    assert not Lease.objects.exists()


@pytest.mark.parametrize("count", [0, 65])
def test_start_lease_refuses_a_gpu_count_out_of_range(host: Host, count: int) -> None:
    renter = f.make_user("renter")
    with pytest.raises(services.LeaseError, match="between 1 and 64"):
        services.start_lease(renter, host, list(range(count)), f.lease_spec())
    assert not Lease.objects.exists()


def test_start_lease_refuses_a_gpu_already_granted(host: Host) -> None:
    f.start_lease(host, [0])
    with pytest.raises(services.LeaseError, match="rented by someone else"):
        f.start_lease(host, [1, 0])
    assert Lease.objects.count() == 1


def test_epochs_strictly_grow_between_leases(host: Host) -> None:
    first = f.start_lease(host, [0])
    second = f.start_lease(host, [1])
    services.release_lease(first.pk)
    f.ack(f.command_of(first, Kind.RELEASE))
    third = f.start_lease(host, [0])
    assert first.epoch < second.epoch < third.epoch


def test_two_renters_racing_for_one_gpu_get_exactly_one_lease(transactional_db: None) -> None:
    host = f.register_host(gpus=[0])
    renters = [f.make_user("renter"), f.make_user("renter")]
    barrier = threading.Barrier(len(renters), timeout=30)
    outcomes: list[Lease | BaseException] = []
    lock = threading.Lock()

    def rent(renter: Any) -> None:
        try:
            barrier.wait()
            result: Lease | BaseException = services.start_lease(renter, host, [0], f.lease_spec())
        except BaseException as exc:  # collected and checked below
            result = exc
        finally:
            connection.close()
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=rent, args=(renter,)) for renter in renters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)

    leases = [o for o in outcomes if isinstance(o, Lease)]
    refusals = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(leases) == 1, outcomes
    assert len(refusals) == 1, refusals
    assert isinstance(refusals[0], services.LeaseError), refusals
    assert Lease.objects.count() == 1
    assert LeaseGpu.objects.filter(active=True).count() == 1
    assert leases[0].commands.count() == 1


# --- record_ack ---------------------------------------------------------------------------------


def test_reserve_ok_moves_the_lease_to_starting_and_queues_docker_run(host: Host) -> None:
    lease = f.start_lease(
        host,
        image="cloudgpu-test/busybox:latest",
        ports=[8080, 9090],
        env={"GREETING": "hello"},
        user="1000:1000",
    )
    reserve = f.command_of(lease, Kind.RESERVE)

    assert f.ack(reserve, result={"gpu_indices": [0], "warnings": ["fan at 90%"]})

    lease.refresh_from_db()
    assert lease.state == State.STARTING
    assert lease.warnings == ["fan at 90%"]
    reserve.refresh_from_db()
    assert (reserve.state, reserve.ok) == ("acked", True)
    run = lease.commands.get(kind=Kind.DOCKER_RUN)
    assert run.state == Command.State.QUEUED
    message = _parse(run)
    assert isinstance(message, DockerRun)
    assert message.image == "cloudgpu-test/busybox:latest"
    assert message.ports == (8080, 9090)
    assert message.env == {"GREETING": "hello"}
    assert message.command == ("httpd", "-f", "-p", "8080")
    assert message.user == "1000:1000"
    assert (message.lease_id, message.epoch) == (str(lease.id), lease.epoch)


def test_docker_run_ok_makes_the_lease_running(starting: Lease) -> None:
    run = f.command_of(starting, Kind.DOCKER_RUN)

    assert f.ack(run, result={"container_id": "abc123", "ports": {"8080": 41000}})

    starting.refresh_from_db()
    assert starting.state == State.RUNNING
    assert starting.container_id == "abc123"
    assert starting.host_ports == {"8080": 41000}
    assert starting.running_since is not None
    assert _granted(starting)


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        (
            "docker.io/library/busybox@sha256:" + "a" * 64,
            "docker.io/library/busybox@sha256:" + "a" * 64,
        ),
        ("sha256:" + "b" * 64, "sha256:" + "b" * 64),  # the supplier's own image, opted in
        ("busybox@sha256:short", ""),
        ("x\n@sha256:" + "c" * 64, ""),
        (["not", "a", "string"], ""),
        (None, ""),
    ],
)
def test_the_lease_records_the_digest_its_container_runs(
    starting: Lease, sent: object, kept: str
) -> None:
    """Issue 33 item 2: what ran is pinned on the lease; an agent's malformed word is dropped."""
    run = f.command_of(starting, Kind.DOCKER_RUN)

    assert f.ack(run, result={"container_id": "abc123", "image_digest": sent})

    starting.refresh_from_db()
    assert starting.state == State.RUNNING
    assert starting.image_digest == kept


def test_the_same_ack_twice_is_applied_once(host: Host) -> None:
    lease = f.start_lease(host)
    reserve = f.command_of(lease, Kind.RESERVE)
    assert f.ack(reserve, result={"warnings": ["first"]})
    lease.refresh_from_db()
    reserve.refresh_from_db()
    lease_before = {k: v for k, v in vars(lease).items() if not k.startswith("_")}
    acked_at = reserve.acked_at

    assert f.ack(reserve, result={"warnings": ["second"]}) is False

    lease.refresh_from_db()
    reserve.refresh_from_db()
    assert {k: v for k, v in vars(lease).items() if not k.startswith("_")} == lease_before
    assert reserve.acked_at == acked_at
    assert reserve.result == {"warnings": ["first"]}
    assert lease.commands.filter(kind=Kind.DOCKER_RUN).count() == 1


def test_the_same_docker_run_ack_twice_is_applied_once(starting: Lease) -> None:
    run = f.command_of(starting, Kind.DOCKER_RUN)
    assert f.ack(run, result={"container_id": "first"})
    assert f.ack(run, result={"container_id": "second"}) is False
    starting.refresh_from_db()
    assert starting.container_id == "first"


def test_a_failed_reserve_fails_the_lease_with_a_readable_reason(host: Host) -> None:
    lease = f.start_lease(host)
    error = "GPU 0 is locked by another platform (pid 4711)"

    assert f.ack(f.command_of(lease, Kind.RESERVE), ok=False, error=error)

    lease.refresh_from_db()
    assert lease.state == State.FAILED
    assert lease.end_reason == Lease.EndReason.ERROR
    assert lease.failure_reason == f"The GPU is in use by another platform on this host: {error}"
    assert lease.ended_at is not None
    assert not _granted(lease)
    assert not lease.commands.filter(kind=Kind.DOCKER_RUN).exists()


def test_after_a_failed_reserve_the_gpu_can_be_rented_again(host: Host) -> None:
    lease = f.start_lease(host)
    f.ack(f.command_of(lease, Kind.RESERVE), ok=False, error="held by another process")

    again = f.start_lease(host)

    assert again.state == State.RESERVING
    assert _granted(again)


def test_a_failed_reserve_without_words_still_gives_a_reason(host: Host) -> None:
    lease = f.start_lease(host)
    f.ack(f.command_of(lease, Kind.RESERVE), ok=False, error=None)
    lease.refresh_from_db()
    assert lease.failure_reason  # never a blank failure for the renter


def test_a_failed_docker_run_fails_the_lease_and_queues_a_release(starting: Lease) -> None:
    error = "image cloudgpu-test/nope:latest not found"

    assert f.ack(f.command_of(starting, Kind.DOCKER_RUN), ok=False, error=error)

    starting.refresh_from_db()
    assert starting.state == State.FAILED
    assert starting.failure_reason == f"The image could not be found: {error}"
    release = starting.commands.get(kind=Kind.RELEASE)
    assert release.state == Command.State.QUEUED
    assert isinstance(_parse(release), Release)
    # The agent may still hold the GPU: it stays granted until the release is confirmed.
    assert _granted(starting)


def test_a_failed_docker_runs_gpu_is_freed_by_the_release_ack(host: Host, starting: Lease) -> None:
    f.ack(f.command_of(starting, Kind.DOCKER_RUN), ok=False, error="image not found")
    with pytest.raises(services.LeaseError):
        f.start_lease(host)

    assert f.ack(f.command_of(starting, Kind.RELEASE))

    starting.refresh_from_db()
    assert starting.state == State.FAILED  # a lease that never ran stays failed
    assert not _granted(starting)
    assert f.start_lease(host).state == State.RESERVING


def test_an_ack_from_another_host_is_ignored(host: Host) -> None:
    lease = f.start_lease(host)
    reserve = f.command_of(lease, Kind.RESERVE)
    other = f.register_host()

    assert (
        services.record_ack(other.pk, Ack(command_id=str(reserve.id), ok=False, error="nope"))
        is False
    )

    reserve.refresh_from_db()
    lease.refresh_from_db()
    assert reserve.state == Command.State.QUEUED
    assert lease.state == State.RESERVING
    assert _granted(lease)


def test_an_ack_for_an_unknown_command_is_ignored(host: Host) -> None:
    lease = f.start_lease(host)
    assert services.record_ack(host.pk, Ack(command_id=str(lease.id), ok=True)) is False


# --- release_lease ------------------------------------------------------------------------------


def test_release_moves_a_running_lease_to_stopping_with_a_release(running: Lease) -> None:
    lease = services.release_lease(running.pk)

    assert lease.state == State.STOPPING
    assert lease.end_reason == Lease.EndReason.RENTER_STOP
    release = running.commands.get(kind=Kind.RELEASE)
    assert release.state == Command.State.QUEUED
    message = _parse(release)
    assert isinstance(message, Release)
    assert message.reason == "renter_stop"
    assert (message.lease_id, message.epoch) == (str(running.id), running.epoch)
    assert _granted(running)  # until the agent confirms


def test_release_is_idempotent(running: Lease) -> None:
    services.release_lease(running.pk)
    again = services.release_lease(running.pk, Lease.EndReason.ADMIN)

    assert again.state == State.STOPPING
    assert again.end_reason == Lease.EndReason.RENTER_STOP
    assert running.commands.filter(kind=Kind.RELEASE).count() == 1


def test_the_release_ack_ends_the_lease_and_frees_the_gpu(host: Host, running: Lease) -> None:
    services.release_lease(running.pk)

    assert f.ack(f.command_of(running, Kind.RELEASE))

    running.refresh_from_db()
    assert running.state == State.ENDED
    assert running.end_reason == Lease.EndReason.RENTER_STOP
    assert running.ended_at is not None
    assert not _granted(running)
    assert f.start_lease(host).state == State.RESERVING


def test_releasing_an_ended_lease_changes_nothing(running: Lease) -> None:
    services.release_lease(running.pk)
    f.ack(f.command_of(running, Kind.RELEASE))

    lease = services.release_lease(running.pk)

    assert lease.state == State.ENDED
    assert running.commands.filter(kind=Kind.RELEASE).count() == 1


def test_release_of_a_reserving_lease_withdraws_its_unanswered_reserve(host: Host) -> None:
    """Outbox commands are re-sent until acked, each by its own task: a reserve still pending
    after the release can reach the agent after it, and the agent then claims the GPU for a
    lease the hub has ended (and refuses the GPU's next renter)."""
    lease = f.start_lease(host)

    services.release_lease(lease.pk)

    assert [c.kind for c in _pending(lease)] == [Kind.RELEASE]


# --- record_container_exit ----------------------------------------------------------------------


def test_a_container_exit_stops_a_running_lease(host: Host, running: Lease) -> None:
    services.record_container_exit(
        host.pk, ContainerExited(lease_id=str(running.id), exit_code=137, log_tail="oom\nkilled")
    )

    running.refresh_from_db()
    assert running.state == State.STOPPING
    assert running.end_reason == Lease.EndReason.EXITED
    assert running.exit_code == 137
    assert running.log_tail == "oom\nkilled"
    assert running.commands.get(kind=Kind.RELEASE).state == Command.State.QUEUED


def test_an_oom_killed_container_ends_its_lease_saying_so(host: Host, running: Lease) -> None:
    services.record_container_exit(
        host.pk,
        ContainerExited(lease_id=str(running.id), exit_code=137, log_tail="", oom_killed=True),
    )

    running.refresh_from_db()
    assert running.state == State.STOPPING
    assert running.end_reason == Lease.EndReason.OUT_OF_MEMORY


def test_a_container_exit_keeps_only_the_end_of_a_long_log(host: Host, running: Lease) -> None:
    log_tail = "x" * 100 + "y" * 16384
    services.record_container_exit(
        host.pk, ContainerExited(lease_id=str(running.id), exit_code=0, log_tail=log_tail)
    )
    running.refresh_from_db()
    assert running.log_tail == "y" * 16384


def test_a_container_exit_reported_by_another_host_is_ignored(running: Lease) -> None:
    other = f.register_host()
    services.record_container_exit(
        other.pk, ContainerExited(lease_id=str(running.id), exit_code=1, log_tail="spoof")
    )
    running.refresh_from_db()
    assert running.state == State.RUNNING
    assert running.exit_code is None
    assert running.log_tail == ""


# --- host loss ----------------------------------------------------------------------------------


def test_a_lease_lost_past_the_grace_ends_and_its_commands_fail(
    host: Host, starting: Lease
) -> None:
    lost_at = timezone.now()
    services.note_host_lost(host.pk, lost_at)
    run = f.command_of(starting, Kind.DOCKER_RUN)
    later = lost_at + timedelta(seconds=settings.LEASE_HOST_GRACE_S + 1)

    assert services.end_leases_of_lost_hosts(now=later) == [str(starting.id)]

    starting.refresh_from_db()
    assert starting.state == State.ENDED
    assert starting.end_reason == Lease.EndReason.HOST_LOST
    assert starting.failure_reason
    assert not _granted(starting)
    run.refresh_from_db()
    assert run.state == Command.State.FAILED
    # Only a release is left, for an agent that is (or comes back) still holding the claim.
    assert [c.kind for c in _pending(starting)] == [Kind.RELEASE]


def test_a_lease_lost_within_the_grace_stays(host: Host, running: Lease) -> None:
    lost_at = timezone.now()
    services.note_host_lost(host.pk, lost_at)
    within = lost_at + timedelta(seconds=settings.LEASE_HOST_GRACE_S - 1)

    assert services.end_leases_of_lost_hosts(now=within) == []

    running.refresh_from_db()
    assert running.state == State.RUNNING
    assert running.host_lost_since == lost_at
    assert _granted(running)


def test_a_stopping_lease_whose_host_never_returns_ends_past_the_grace(
    host: Host, running: Lease
) -> None:
    services.release_lease(running.pk)
    lost_at = timezone.now()
    services.note_host_lost(host.pk, lost_at)
    running.refresh_from_db()
    assert running.host_lost_since == lost_at  # the stopping lease stops being billed here
    later = lost_at + timedelta(seconds=settings.LEASE_HOST_GRACE_S + 1)

    assert services.end_leases_of_lost_hosts(now=later) == [str(running.id)]
    running.refresh_from_db()
    assert running.state == State.ENDED
    assert running.end_reason == Lease.EndReason.RENTER_STOP  # the first reason stays
    assert not _granted(running)


def test_note_host_lost_keeps_the_first_loss_time(host: Host, running: Lease) -> None:
    first = timezone.now()
    services.note_host_lost(host.pk, first)
    services.note_host_lost(host.pk, first + timedelta(minutes=5))
    running.refresh_from_db()
    assert running.host_lost_since == first


# --- expire_command -----------------------------------------------------------------------------


def test_an_expired_reserve_fails_the_lease_and_queues_a_release(host: Host) -> None:
    lease = f.start_lease(host)
    reserve = f.command_of(lease, Kind.RESERVE)

    services.expire_command(reserve.pk)

    reserve.refresh_from_db()
    assert reserve.state == Command.State.FAILED
    assert reserve.error
    lease.refresh_from_db()
    assert lease.state == State.FAILED
    assert lease.failure_reason == "The host did not answer in time."
    assert [c.kind for c in _pending(lease)] == [Kind.RELEASE]
    assert _granted(lease)  # the agent may hold it: freed by the release's answer or expiry


def test_an_expired_release_is_asked_again_and_the_gpu_stays_granted(
    host: Host, running: Lease
) -> None:
    services.release_lease(running.pk)
    release = f.command_of(running, Kind.RELEASE)

    services.expire_command(release.pk)

    running.refresh_from_db()
    assert running.state == State.STOPPING
    # The agent may still run the container: the GPU is not handed to anyone else.
    assert _granted(running)
    release.refresh_from_db()
    assert release.state == Command.State.FAILED
    assert [c.kind for c in _pending(running)] == [Kind.RELEASE]


def test_a_failed_release_is_retried_later_and_the_gpu_stays_granted(
    host: Host, running: Lease
) -> None:
    services.release_lease(running.pk)
    release = f.command_of(running, Kind.RELEASE)

    assert services.record_ack(host.pk, Ack(command_id=str(release.pk), ok=False, error="busy"))

    running.refresh_from_db()
    assert running.state == State.STOPPING
    assert _granted(running)
    (retry,) = _pending(running)
    assert retry.kind == Kind.RELEASE
    assert retry.next_attempt_at > timezone.now()


def test_expiring_an_acked_command_changes_nothing(running: Lease) -> None:
    run = f.command_of(running, Kind.DOCKER_RUN)
    services.expire_command(run.pk)
    run.refresh_from_db()
    running.refresh_from_db()
    assert run.state == Command.State.ACKED
    assert running.state == State.RUNNING


# --- dispatch -----------------------------------------------------------------------------------


def test_dispatch_without_a_connection_leaves_the_command_queued(host: Host) -> None:
    assert host.channel_name == ""
    lease = f.start_lease(host)
    command = f.command_of(lease, Kind.RESERVE)
    first_attempt_at = command.next_attempt_at

    assert tasks.dispatch_command(str(command.id)) == "no connection"

    command.refresh_from_db()
    assert command.state == Command.State.QUEUED
    assert command.attempts == 0
    assert command.next_attempt_at >= first_attempt_at + timedelta(
        seconds=settings.COMMAND_RESEND_S
    )


async def _receive(layer: Any, channel: str) -> dict[str, Any]:
    return await asyncio.wait_for(layer.receive(channel), timeout=10)


def test_dispatch_sends_the_command_through_the_channel_layer(transactional_db: None) -> None:
    layer = get_channel_layer()
    assert layer is not None
    channel = async_to_sync(layer.new_channel)()
    host = f.register_host(channel_name=channel)
    lease = f.start_lease(host)
    command = f.command_of(lease, Kind.RESERVE)

    # (The on-commit publish of this task went to the real broker; no worker runs here.)
    assert tasks.dispatch_command(str(command.id)) == "sent"

    event = async_to_sync(_receive)(layer, channel)
    assert event["type"] == "agent.command"
    assert json.loads(event["frame"]) == command.payload
    command.refresh_from_db()
    assert command.state == Command.State.SENT
    assert command.attempts == 1
    assert command.sent_at is not None


def test_services_send_commands_to_the_dispatch_task_by_its_name() -> None:
    """The services enqueue the dispatch by name (the task module builds on them): the name
    must be the task's."""
    assert tasks.dispatch_command.name == services.DISPATCH_TASK


def test_a_plain_rent_costs_a_fixed_handful_of_statements(host: Host) -> None:
    """Issue 15's dispatch: the rent's transaction is on every rental's path. No volumes and no
    tunnels cost no statement; the count does not grow with the host's GPUs or leases."""
    f.start_lease(host, [1])
    with CaptureQueriesContext(connection) as queries:
        f.start_lease(host, [0])
    statements = [
        q["sql"]
        for q in queries.captured_queries
        if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    # user (the renter made), the renter's row locked, host, GPUs, active grant check, epoch,
    # lease, grant, reserve command
    assert len(statements) == 9, "\n".join(statements)
    assert not any("volumes_volume" in s or "tunnels_tunnel" in s for s in statements)
