"""Issue 33 item 1: a rental writing as fast as it can, on a real Docker engine and this
machine's real disk. The agent's disk guard stops it within its allowance plus the stated
margin, warns a slower one first, and never lets a writer take the host below the supplier's
free-disk floor; while the disk is that low, the host takes no new rentals.

(The hub's side, the lease ending with the reason on its page, is in tests/hub/leases.)
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from supplier_agent.containers import LABEL_CLAIM, LABEL_LEASE, ContainerError, ContainerRuntime
from supplier_agent.disk_guard import GUARD_BAND_BYTES, MARGIN_BYTES, MIB, DiskGuard
from supplier_agent.disk_usage import Usage, measure_tree
from supplier_agent.protocol import DockerRun
from tests.support.polling import wait_for

pytestmark = pytest.mark.docker

GIB = 1024**3
# Full speed, and more than any allowance here: only the guard ends it early.
FLOOD = ("dd", "if=/dev/zero", "of=/flood", "bs=1M", "count=8192", "conv=fsync")


@dataclass
class Events:
    got: list[tuple[str, str, str]] = field(default_factory=list)

    def __call__(self, lease_id: str, cause: str, sentence: str) -> None:
        self.got.append((lease_id, cause, sentence))

    def stops(self, lease_id: str) -> list[tuple[str, str]]:
        return [(c, s) for lease, c, s in self.got if lease == lease_id and c]

    def notices(self, lease_id: str) -> list[str]:
        return [s for lease, c, s in self.got if lease == lease_id and not c]


@pytest.fixture
def runtime(docker_client: Any) -> ContainerRuntime:
    return ContainerRuntime(
        docker_client, gpu_devices="none", stop_grace_s=1, allow_local_images=True
    )


def _root(docker_client: Any) -> str:
    return str(docker_client.info()["DockerRootDir"])


def _room(docker_client: Any, needed: int) -> None:
    free = shutil.disk_usage(_root(docker_client)).free
    if free < needed:
        pytest.skip(f"needs {needed / GIB:.0f} GiB free on Docker's disk, has {free / GIB:.1f}")


def _guard(
    docker_client: Any,
    runtime: ContainerRuntime,
    agent_id: str,
    floor_bytes: int,
    stop_container: Any = None,
) -> DiskGuard:
    return DiskGuard(
        docker_client,
        _root(docker_client),
        claim_label=LABEL_CLAIM,
        lease_label=LABEL_LEASE,
        agent_id=agent_id,
        floor_bytes=floor_bytes,
        stop_container=stop_container or runtime.stop_for_disk,
    )


@pytest.fixture
def watching() -> Iterator[Any]:
    """Runs guards in threads, as the agent does, and stops them after the test."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def start(guard: DiskGuard, events: Events) -> None:
        thread = threading.Thread(target=guard.watch, args=(events, stop), daemon=True)
        thread.start()
        threads.append(thread)

    yield start
    stop.set()
    for thread in threads:
        thread.join(timeout=30)


def _lease(
    runtime: ContainerRuntime, image: str, agent_id: str, command: tuple[str, ...], allowance: int
) -> tuple[str, str]:
    spec = DockerRun(
        command_id=str(uuid.uuid4()),
        lease_id=str(uuid.uuid4()),
        epoch=1,
        image=image,
        command=command,
        disk_allowance_bytes=allowance,
    )
    result = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)
    return spec.lease_id, result.container_id


def _stopped(docker_client: Any, container_id: str) -> None:
    wait_for(
        lambda: docker_client.api.inspect_container(container_id)["State"]["Running"] is False,
        timeout_s=30,
        what="the container to be stopped",
    )


def _written(docker_client: Any, container_id: str) -> int:
    """What the container has on the host's disk now (its writable layer)."""
    upper = docker_client.api.inspect_container(container_id)["GraphDriver"]["Data"]["UpperDir"]
    usage = Usage()
    assert measure_tree(upper, usage, limit=10**9)
    return usage.bytes


def test_a_full_speed_writer_is_stopped_within_its_allowance_and_the_margin(
    docker_client: Any,
    runtime: ContainerRuntime,
    busybox_image: str,
    agent_id: str,
    watching: Any,
) -> None:
    _room(docker_client, 8 * GIB)
    allowance = 512 * MIB
    guard = _guard(docker_client, runtime, agent_id, floor_bytes=0)
    events = Events()
    watching(guard, events)

    lease_id, container_id = _lease(runtime, busybox_image, agent_id, FLOOD, allowance)

    stops = wait_for(lambda: events.stops(lease_id), timeout_s=120, what="the guard's stop")
    assert [cause for cause, _ in stops] == ["disk_allowance"]
    assert "over its allowance of 512 MiB" in stops[0][1]
    _stopped(docker_client, container_id)
    written = _written(docker_client, container_id)
    assert allowance < written <= allowance + MARGIN_BYTES, written / MIB
    guard.check(events)  # a later pass: the stop is reported once
    assert len(events.stops(lease_id)) == 1


def test_a_rental_nearing_its_allowance_is_warned_first_and_goes_on(
    docker_client: Any,
    runtime: ContainerRuntime,
    busybox_image: str,
    agent_id: str,
    watching: Any,
) -> None:
    _room(docker_client, 4 * GIB)
    allowance = 200 * MIB
    # 185 MiB: past 90 % of the allowance, under it.
    write = ("sh", "-c", "dd if=/dev/zero of=/data bs=1M count=185 conv=fsync && exec sleep 600")
    guard = _guard(docker_client, runtime, agent_id, floor_bytes=0)
    events = Events()
    watching(guard, events)

    lease_id, container_id = _lease(runtime, busybox_image, agent_id, write, allowance)

    notices = wait_for(lambda: events.notices(lease_id), timeout_s=120, what="the warning")
    assert "disk nearly full" in notices[0]
    assert "of its 200 MiB allowance used" in notices[0]
    assert events.stops(lease_id) == []
    assert docker_client.api.inspect_container(container_id)["State"]["Running"] is True
    # Once only, however many passes follow.
    guard.check(events)
    assert len(events.notices(lease_id)) == 1


def test_a_writer_never_takes_the_host_below_the_floor(
    docker_client: Any,
    runtime: ContainerRuntime,
    busybox_image: str,
    agent_id: str,
    watching: Any,
) -> None:
    _room(docker_client, 10 * GIB)
    root = _root(docker_client)
    # The supplier's floor sits 2 GiB below what is free now; the rental's allowance would
    # let it write far past it.
    floor = shutil.disk_usage(root).free - 2 * GIB - GUARD_BAND_BYTES
    guard = _guard(docker_client, runtime, agent_id, floor_bytes=floor)
    events = Events()
    lowest = [shutil.disk_usage(root).free]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.05):
            lowest[0] = min(lowest[0], shutil.disk_usage(root).free)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        watching(guard, events)
        lease_id, _ = _lease(runtime, busybox_image, agent_id, FLOOD, 100 * GIB)
        stops = wait_for(lambda: events.stops(lease_id), timeout_s=120, what="the guard's stop")
    finally:
        sampling.set()
        sampler.join()

    assert [cause for cause, _ in stops] == ["disk_floor"]
    assert "writing the most" in stops[0][1]
    assert lowest[0] >= floor, f"{(floor - lowest[0]) / MIB:.0f} MiB below the floor"
    # What the stopped rental left still holds the disk near the floor: no new rentals.
    refusal = guard.refusal()
    assert refusal is not None
    assert "takes no new rentals" in refusal


def test_a_writer_into_a_deleted_file_it_holds_open_is_stopped_too(
    docker_client: Any,
    runtime: ContainerRuntime,
    busybox_image: str,
    agent_id: str,
    watching: Any,
) -> None:
    """No folder lists a file deleted while open, yet it fills the disk until closed: the
    guard counts the blocks behind the container's processes' open descriptors."""
    _room(docker_client, 8 * GIB)
    hidden = ("sh", "-c", "exec 3>/x; rm /x; dd if=/dev/zero bs=1M count=8192 >&3; sleep 600")
    guard = _guard(docker_client, runtime, agent_id, floor_bytes=0)
    events = Events()
    watching(guard, events)

    lease_id, container_id = _lease(runtime, busybox_image, agent_id, hidden, 512 * MIB)

    stops = wait_for(lambda: events.stops(lease_id), timeout_s=120, what="the guard's stop")
    assert [cause for cause, _ in stops] == ["disk_allowance"]
    _stopped(docker_client, container_id)


def test_a_failed_stop_does_not_end_the_guard(
    docker_client: Any,
    runtime: ContainerRuntime,
    busybox_image: str,
    agent_id: str,
    watching: Any,
) -> None:
    """The engine refused the first kill (it was restarting, say): the guard logs it and
    stops the rental at a later pass, instead of dying and bounding nothing from then on."""
    _room(docker_client, 8 * GIB)
    attempts: list[str] = []

    def flaky_stop(container_id: str) -> None:
        attempts.append(container_id)
        if len(attempts) == 1:
            raise ContainerError("the Docker engine is not reachable")
        runtime.stop_for_disk(container_id)

    guard = _guard(docker_client, runtime, agent_id, floor_bytes=0, stop_container=flaky_stop)
    events = Events()
    watching(guard, events)

    lease_id, container_id = _lease(runtime, busybox_image, agent_id, FLOOD, 512 * MIB)

    wait_for(lambda: events.stops(lease_id), timeout_s=120, what="the stop after a failed one")
    assert len(attempts) >= 2
    _stopped(docker_client, container_id)


def test_a_slow_writer_near_the_floor_is_stopped_before_it(
    docker_client: Any,
    runtime: ContainerRuntime,
    busybox_image: str,
    agent_id: str,
    watching: Any,
) -> None:
    """Slow enough that no pass a second apart sees more than a few MiB of growth: growth
    counts over the whole window, so it is still the writer to stop."""
    _room(docker_client, 8 * GIB)
    root = _root(docker_client)
    floor = shutil.disk_usage(root).free - GUARD_BAND_BYTES - 200 * MIB
    trickle = (
        "sh",
        "-c",
        "i=0; while [ $i -lt 400 ]; do dd if=/dev/zero of=/t$i bs=1M count=12 conv=fsync "
        "2>/dev/null; i=$((i+1)); sleep 1; done; sleep 600",
    )
    guard = _guard(docker_client, runtime, agent_id, floor_bytes=floor)
    events = Events()
    watching(guard, events)

    lease_id, _ = _lease(runtime, busybox_image, agent_id, trickle, 100 * GIB)

    stops = wait_for(lambda: events.stops(lease_id), timeout_s=180, what="the guard's stop")
    assert [cause for cause, _ in stops] == ["disk_floor"]
    assert shutil.disk_usage(root).free >= floor


def test_a_writer_is_caught_while_the_host_frees_space_meanwhile(
    docker_client: Any,
    runtime: ContainerRuntime,
    busybox_image: str,
    agent_id: str,
    watching: Any,
    tmp_path: Any,
) -> None:
    """The supplier's own job deletes 4 GiB as the rental floods: the host's free space rises,
    hiding the writer from a guard that watched only it. The rental's own write counters
    still give it away within a tick."""
    _room(docker_client, 12 * GIB)
    if os.stat(tmp_path).st_dev != os.stat(_root(docker_client)).st_dev:
        pytest.skip("the test's folder is not on Docker's disk here")
    ballast = tmp_path / "ballast"
    with open(ballast, "wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, 4 * GIB)
    allowance = 512 * MIB
    guard = _guard(docker_client, runtime, agent_id, floor_bytes=0)
    events = Events()
    watching(guard, events)

    lease_id, container_id = _lease(runtime, busybox_image, agent_id, FLOOD, allowance)
    ballast.unlink()

    wait_for(lambda: events.stops(lease_id), timeout_s=120, what="the guard's stop")
    _stopped(docker_client, container_id)
    written = _written(docker_client, container_id)
    assert allowance < written <= allowance + MARGIN_BYTES, written / MIB
