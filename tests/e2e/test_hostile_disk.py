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

from supplier_agent.containers import LABEL_CLAIM, LABEL_LEASE, ContainerRuntime
from supplier_agent.disk_guard import (
    GUARD_BAND_BYTES,
    MARGIN_BYTES,
    MIB,
    DiskGuard,
    Usage,
    measure_tree,
)
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
    docker_client: Any, runtime: ContainerRuntime, agent_id: str, floor_bytes: int
) -> DiskGuard:
    return DiskGuard(
        docker_client,
        _root(docker_client),
        claim_label=LABEL_CLAIM,
        lease_label=LABEL_LEASE,
        agent_id=agent_id,
        floor_bytes=floor_bytes,
        stop_container=runtime.stop_for_disk,
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


def _written(docker_client: Any, container_id: str) -> int:
    """What the container has on the host's disk now (its writable layer)."""
    upper = docker_client.api.inspect_container(container_id)["GraphDriver"]["Data"]["UpperDir"]
    usage = Usage()
    measure_tree(upper, usage)
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
    wait_for(
        lambda: docker_client.api.inspect_container(container_id)["State"]["Running"] is False,
        timeout_s=30,
        what="the container to be stopped",
    )
    written = _written(docker_client, container_id)
    assert allowance < written <= allowance + MARGIN_BYTES, written / MIB
    # The exit watcher was told: the guard's stop is reported once, with its reason.
    assert lease_id not in {r.lease_id for r in guard.rentals.values()}


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


def test_measuring_counts_blocks_once_per_file_and_stops_at_the_file_limit(
    tmp_path: Any,
) -> None:
    (tmp_path / "a").write_bytes(b"x" * (1024 * 1024))
    os.link(tmp_path / "a", tmp_path / "hard")  # the same blocks: counted once
    (tmp_path / "sub").mkdir()
    for i in range(20):
        (tmp_path / "sub" / str(i)).write_bytes(b"y")
    usage = Usage()
    measure_tree(str(tmp_path), usage)
    assert usage.files == 23
    assert 1024 * 1024 <= usage.bytes < 2 * 1024 * 1024 + 24 * 8192

    bounded = Usage()
    measure_tree(str(tmp_path), bounded, limit=5)
    assert bounded.files == 6  # stopped at the first file past the limit: a pass is bounded
