"""Renters' volumes (caches and their own) on a real Docker engine: idle ones go, used ones stay,
a full disk takes the oldest unused first, the hub's deletes wait for the volume to be free, and
reports carry sizes and removals."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound

from supplier_agent.containers import LABEL_CACHE, LABEL_VOLUME, renter_volume_name
from supplier_agent.protocol import (
    MAX_FRAME_BYTES,
    RenterVolume,
    VolumeRemoval,
    VolumeUsage,
    encode,
    parse_message,
)
from supplier_agent.volumes import DAY_S, GIB, VolumeJanitor, _split
from tests.support.docker_cleanup import remove_volume

pytestmark = pytest.mark.docker

NOW = 1_900_000_000.0


@pytest.fixture
def make_volume(docker_client: Any) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def make() -> str:
        name = f"cloudgpu-cache-renter-test{uuid.uuid4().hex[:12]}"
        docker_client.volumes.create(name, labels={LABEL_CACHE: name})
        made.append(name)
        return name

    yield make
    _remove_volumes(docker_client, made)


@pytest.fixture
def make_renter_volume(docker_client: Any) -> Iterator[Callable[[], str]]:
    """A renter volume as containers.py makes it; returns its wire name (vol-<40 hex>)."""
    made: list[str] = []

    def make() -> str:
        name = f"vol-{uuid.uuid4().hex}{uuid.uuid4().hex[:8]}"
        docker_client.volumes.create(renter_volume_name(name), labels={LABEL_VOLUME: name})
        made.append(renter_volume_name(name))
        return name

    yield make
    _remove_volumes(docker_client, made)


def _remove_volumes(docker_client: Any, made: list[str]) -> None:
    for name in made:
        remove_volume(docker_client, name)


def _exists(docker_client: Any, name: str) -> bool:
    try:
        docker_client.volumes.get(name)
    except NotFound:
        return False
    return True


def test_idle_unused_caches_go_and_used_or_recent_ones_stay(
    docker_client: Any, busybox_image: str, make_volume: Callable[[], str], tmp_path: Path
) -> None:
    janitor = VolumeJanitor(docker_client, tmp_path, idle_days=14, free_bytes=lambda: 10**15)
    idle, recent, mounted, unseen = make_volume(), make_volume(), make_volume(), make_volume()
    janitor.note_used(idle, NOW - 20 * DAY_S)
    janitor.note_used(recent, NOW - 1 * DAY_S)
    janitor.note_used(mounted, NOW - 20 * DAY_S)
    holder = docker_client.containers.create(
        busybox_image, ["true"], volumes={mounted: {"bind": "/cache", "mode": "rw"}}
    )

    removed = janitor.sweep(NOW)

    assert idle in removed
    assert not _exists(docker_client, idle)
    for kept in (recent, mounted, unseen):
        assert kept not in removed
        assert _exists(docker_client, kept)
    # The mounted one's clock and the unseen one's start now: 14 days from here.
    holder.remove(force=True)
    assert not {mounted, unseen} & set(janitor.sweep(NOW + 13 * DAY_S))
    assert {mounted, unseen} <= set(janitor.sweep(NOW + 15 * DAY_S))


def test_under_the_disk_floor_unused_caches_go_oldest_first(
    docker_client: Any, make_volume: Callable[[], str], tmp_path: Path
) -> None:
    older, newer = make_volume(), make_volume()
    # The disk has 5 GiB free (the floor is 20) until the older volume is gone, then 50.
    janitor = VolumeJanitor(
        docker_client,
        tmp_path,
        idle_days=14,
        disk_floor_bytes=20 * GIB,
        free_bytes=lambda: (5 if _exists(docker_client, older) else 50) * GIB,
    )
    janitor.note_used(older, NOW - 3 * DAY_S)
    janitor.note_used(newer, NOW - 2 * DAY_S)

    removals = janitor.sweep(NOW)

    assert older in removals
    assert newer not in removals
    assert _exists(docker_client, newer)


def _removals(janitor: VolumeJanitor) -> dict[str, VolumeRemoval]:
    return {r.name: r for report in janitor.reports(NOW) for r in report.removed}


def test_an_idle_renter_volume_goes_as_idle_and_a_mounted_one_stays(
    docker_client: Any,
    busybox_image: str,
    make_renter_volume: Callable[[], str],
    tmp_path: Path,
) -> None:
    janitor = VolumeJanitor(docker_client, tmp_path, idle_days=14, free_bytes=lambda: 10**15)
    idle, mounted = make_renter_volume(), make_renter_volume()
    janitor.note_run(
        [RenterVolume(idle, "/data"), RenterVolume(mounted, "/data")], NOW - 20 * DAY_S
    )
    holder = docker_client.containers.create(
        busybox_image, ["true"], volumes={renter_volume_name(mounted): {"bind": "/d"}}
    )
    try:
        removed = janitor.sweep(NOW)
    finally:
        holder.remove(force=True)

    assert removed == [renter_volume_name(idle)]
    assert not _exists(docker_client, renter_volume_name(idle))
    assert _exists(docker_client, renter_volume_name(mounted))
    assert _removals(janitor) == {idle: VolumeRemoval(idle, "idle", NOW)}
    # Gone for good: a lease that still names it is refused, not given an empty one.
    assert "was removed from this host (idle)" in str(
        janitor.refusal([RenterVolume(idle, "/data")], NOW)
    )


def test_under_the_disk_floor_renter_volumes_go_as_disk_low(
    docker_client: Any, make_renter_volume: Callable[[], str], tmp_path: Path
) -> None:
    older, newer = make_renter_volume(), make_renter_volume()
    janitor = VolumeJanitor(
        docker_client,
        tmp_path,
        free_bytes=lambda: (5 if _exists(docker_client, renter_volume_name(older)) else 50) * GIB,
    )
    janitor.note_run([RenterVolume(older, "/data")], NOW - 3 * DAY_S)
    janitor.note_run([RenterVolume(newer, "/data")], NOW - 2 * DAY_S)

    assert janitor.sweep(NOW) == [renter_volume_name(older)]
    assert _removals(janitor) == {older: VolumeRemoval(older, "disk_low", NOW)}
    assert _exists(docker_client, renter_volume_name(newer))


def test_a_deleted_volume_goes_at_once_when_free_and_after_its_container_when_not(
    docker_client: Any,
    busybox_image: str,
    make_renter_volume: Callable[[], str],
    tmp_path: Path,
) -> None:
    janitor = VolumeJanitor(docker_client, tmp_path, free_bytes=lambda: 10**15)
    free, busy, unknown = make_renter_volume(), make_renter_volume(), "vol-" + "e" * 40
    holder = docker_client.containers.create(
        busybox_image, ["true"], volumes={renter_volume_name(busy): {"bind": "/d"}}
    )
    try:
        assert janitor.delete(free, NOW)
        assert janitor.delete(unknown, NOW)  # never here: removed all the same, so the hub ends
        assert not janitor.delete(busy, NOW)
        assert not janitor.delete_pending(NOW)
        assert _exists(docker_client, renter_volume_name(busy))
        assert "is being deleted" in str(janitor.refusal([RenterVolume(busy, "/data")], NOW))
        assert set(_removals(janitor)) == {free, unknown}
    finally:
        holder.remove(force=True)

    assert janitor.delete_pending(NOW + 5)

    assert not _exists(docker_client, renter_volume_name(free))
    assert not _exists(docker_client, renter_volume_name(busy))
    assert _removals(janitor)[busy] == VolumeRemoval(busy, "deleted", NOW + 5)
    assert _removals(janitor)[free] == VolumeRemoval(free, "deleted", NOW)


def test_removals_are_reported_for_seven_days(
    docker_client: Any, make_renter_volume: Callable[[], str], tmp_path: Path
) -> None:
    janitor = VolumeJanitor(docker_client, tmp_path, free_bytes=lambda: 10**15)
    name = make_renter_volume()
    janitor.delete(name, NOW)

    def reported(at: float) -> set[str]:
        return {r.name for report in janitor.reports(at) for r in report.removed}

    assert reported(NOW + 7 * DAY_S - 60) == {name}
    assert reported(NOW + 7 * DAY_S + 60) == set()


def test_a_report_lists_measured_sizes_and_flags_a_volume_over_its_cap(
    docker_client: Any,
    busybox_image: str,
    make_renter_volume: Callable[[], str],
    tmp_path: Path,
) -> None:
    janitor = VolumeJanitor(docker_client, tmp_path, free_bytes=lambda: 10**15)
    capped, roomy = make_renter_volume(), make_renter_volume()
    janitor.note_run([RenterVolume(capped, "/a", 1024), RenterVolume(roomy, "/b", 2**30)], NOW)
    docker_client.containers.run(
        busybox_image,
        ["sh", "-c", "head -c 65536 /dev/zero > /a/blob && head -c 65536 /dev/zero > /b/blob"],
        volumes={
            renter_volume_name(capped): {"bind": "/a"},
            renter_volume_name(roomy): {"bind": "/b"},
        },
        remove=True,
    )
    before = {v.name: v for report in janitor.reports(NOW) for v in report.volumes}
    assert before[capped].bytes == -1  # not measured yet: unknown, and not over its cap
    assert not before[capped].over_cap
    assert janitor.refusal([RenterVolume(capped, "/a", 1024)], NOW) is None

    janitor.measure(NOW)

    after = {v.name: v for report in janitor.reports(NOW) for v in report.volumes}
    assert after[capped].bytes >= 65536
    assert after[capped].over_cap
    assert after[roomy].bytes >= 65536
    assert not after[roomy].over_cap
    assert not after[capped].in_use
    assert after[capped].last_used == NOW
    refusal = janitor.refusal([RenterVolume(roomy, "/b", 2**30), RenterVolume(capped, "/a", 1024)])
    assert refusal == (
        f"volume {capped} holds more than its size cap of 1 KiB: delete files from it or "
        "create a larger volume"
    )
    # The hub raised the cap: the next lease may mount it again.
    assert janitor.refusal([RenterVolume(capped, "/a", 2**20)]) is None


def test_reports_split_so_that_each_fits_one_frame() -> None:
    # The largest entries there can be: 19-digit sizes, full-precision times.
    usages = [
        VolumeUsage(f"renter-{i:040x}", 2**63 - 1, False, 1234567890.1234567, True)
        for i in range(700)
    ]
    removals = [VolumeRemoval(f"vol-{i:040x}", "disk_low", 1234567890.1234567) for i in range(500)]

    reports = _split(usages, removals)

    assert len(reports) == 4
    assert all(len(encode(report).encode()) < MAX_FRAME_BYTES for report in reports)
    assert [v for r in reports for v in r.volumes] == usages
    assert [x for r in reports for x in r.removed] == removals
    assert all(parse_message(encode(report)) == report for report in reports)
