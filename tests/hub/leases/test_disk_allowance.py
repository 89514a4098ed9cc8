"""Issue 33 item 1, the lease's side: a lease keeps the sum of its GPUs' disk allowances from
its start and its docker_run carries it; the agent stopping it for its disk ends it as ``disk``
with the reason on its page; the agent's notices reach its warnings once."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from hub.leases import commands, services
from hub.leases.models import Command, Lease
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Host
from supplier_agent.protocol import (
    HUB_TO_AGENT,
    ContainerExited,
    DockerRun,
    LeaseNotice,
    parse_message,
)
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

State = Lease.State
Kind = Command.Kind
GIB = 1 << 30
OVER = "Stopped: this rental wrote 51 GiB, over its disk allowance of 50 GiB."


def _parse(command: Command) -> Any:
    return parse_message(json.dumps(command.payload), allowed=HUB_TO_AGENT)


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def host() -> Host:
    return f.register_host(gpus=[0, 1])


@pytest.fixture
def running(host: Host) -> Lease:
    return f.run_lease(host)


def _exit(lease: Lease, **fields: Any) -> ContainerExited:
    return ContainerExited(lease_id=str(lease.id), exit_code=137, **fields)


def _notice(lease: Lease, text: str) -> LeaseNotice:
    return LeaseNotice(lease_id=str(lease.id), text=text)


# --- the allowance a lease starts with ----------------------------------------------------------


def test_a_lease_keeps_the_sum_of_its_gpus_allowances_and_its_docker_run_carries_it(
    host: Host,
) -> None:
    first, second = host.gpus.order_by("index")
    supplier_services.set_gpu_terms(first.pk, disk_allowance_bytes=100 * GIB)
    supplier_services.set_gpu_terms(second.pk, disk_allowance_bytes=30 * GIB)

    lease = f.start_lease(host, [0, 1])
    assert lease.disk_allowance_bytes == 130 * GIB
    # The supplier's change after the start reaches new rentals only.
    supplier_services.set_gpu_terms(first.pk, disk_allowance_bytes=GIB)
    assert f.ack(f.command_of(lease, Kind.RESERVE), result={"gpu_indices": [0, 1]})

    lease.refresh_from_db()
    assert lease.disk_allowance_bytes == 130 * GIB
    run = _parse(f.command_of(lease, Kind.DOCKER_RUN))
    assert isinstance(run, DockerRun)
    assert run.disk_allowance_bytes == 130 * GIB


def test_a_one_gpu_lease_gets_that_gpus_default_allowance(host: Host) -> None:
    lease = f.start_lease(host, [1])
    assert lease.disk_allowance_bytes == 50 * GIB


def test_a_lease_from_before_allowances_leaves_the_field_out_for_the_agents_default(
    running: Lease,
) -> None:
    Lease.objects.filter(pk=running.pk).update(disk_allowance_bytes=None)
    running.refresh_from_db()

    payload = commands.payload(commands.docker_run(running, paid_until=None))

    assert "disk_allowance_bytes" not in payload


# --- the agent stops it for its disk ------------------------------------------------------------


@pytest.mark.parametrize("cause", ["disk_allowance", "disk_floor"])
def test_a_container_the_agent_stopped_for_its_disk_ends_the_lease_as_disk(
    host: Host, running: Lease, cause: str
) -> None:
    services.record_container_exit(host.pk, _exit(running, stop_cause=cause, stop_reason=OVER))

    running.refresh_from_db()
    assert running.state == State.STOPPING
    assert running.end_reason == Lease.EndReason.DISK == "disk"
    assert running.warnings == [OVER]
    assert running.exit_code == 137
    assert running.commands.get(kind=Kind.RELEASE).state == Command.State.QUEUED


def test_the_stop_reason_is_kept_once_though_the_agent_repeats_the_exit(
    host: Host, running: Lease
) -> None:
    # The agent re-sends container_exited with every heartbeat until the release.
    for _ in range(3):
        services.record_container_exit(
            host.pk, _exit(running, stop_cause="disk_allowance", stop_reason=OVER)
        )

    running.refresh_from_db()
    assert running.warnings == [OVER]
    assert running.commands.filter(kind=Kind.RELEASE).count() == 1


def test_a_stop_without_words_gets_the_hubs_words(host: Host, running: Lease) -> None:
    services.record_container_exit(host.pk, _exit(running, stop_cause="disk_floor"))

    running.refresh_from_db()
    assert running.end_reason == Lease.EndReason.DISK
    assert running.warnings == [
        "The host stopped this rental: the host's disk ran low and this rental wrote the most."
    ]


def test_an_oom_kill_without_a_stop_cause_is_still_out_of_memory(
    host: Host, running: Lease
) -> None:
    services.record_container_exit(host.pk, _exit(running, oom_killed=True))

    running.refresh_from_db()
    assert running.end_reason == Lease.EndReason.OUT_OF_MEMORY
    assert running.warnings == []


def test_another_hosts_stop_changes_nothing(running: Lease) -> None:
    other = f.register_host()
    services.record_container_exit(
        other.pk, _exit(running, stop_cause="disk_allowance", stop_reason=OVER)
    )

    running.refresh_from_db()
    assert (running.state, running.end_reason, running.warnings) == (State.RUNNING, "", [])


# --- notices ------------------------------------------------------------------------------------


def test_a_notice_is_added_to_the_warnings_once(host: Host, running: Lease) -> None:
    text = "This rental has written 45 GiB of its 50 GiB disk allowance."

    assert services.record_notice(host.pk, _notice(running, text))
    assert not services.record_notice(host.pk, _notice(running, text))

    running.refresh_from_db()
    assert running.warnings == [text]
    assert running.state == State.RUNNING


def test_a_notice_for_another_hosts_lease_changes_nothing(running: Lease) -> None:
    other = f.register_host()

    assert not services.record_notice(other.pk, _notice(running, "spoofed"))

    running.refresh_from_db()
    assert running.warnings == []


def test_a_notice_for_a_lease_that_ended_changes_nothing(host: Host, running: Lease) -> None:
    services.release_lease(running.pk)
    assert f.ack(f.command_of(running, Kind.RELEASE))
    running.refresh_from_db()
    assert running.state == State.ENDED

    assert not services.record_notice(host.pk, _notice(running, "too late"))

    running.refresh_from_db()
    assert running.warnings == []


def test_a_starting_lease_takes_notices_too(host: Host) -> None:
    lease = f.start_lease(host)
    assert f.ack(f.command_of(lease, Kind.RESERVE), result={"gpu_indices": [0]})

    assert services.record_notice(host.pk, _notice(lease, "pulling used most of the allowance"))

    lease.refresh_from_db()
    assert lease.warnings == ["pulling used most of the allowance"]


def test_a_lease_keeps_its_ten_newest_warnings(host: Host, running: Lease) -> None:
    for n in range(12):
        assert services.record_notice(host.pk, _notice(running, f"notice {n}"))

    running.refresh_from_db()
    assert running.warnings == [f"notice {n}" for n in range(2, 12)]
