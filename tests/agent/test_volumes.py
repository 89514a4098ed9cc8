"""Renters' cache volumes on a real Docker engine: idle ones go, used ones stay, and a full disk
takes the oldest unused first."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from docker.errors import NotFound

from supplier_agent.containers import LABEL_CACHE
from supplier_agent.volumes import DAY_S, GIB, CacheJanitor

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
    for name in made:
        for container in docker_client.containers.list(all=True, filters={"volume": name}):
            container.remove(force=True)
        with contextlib.suppress(NotFound):
            docker_client.volumes.get(name).remove(force=True)


def _exists(docker_client: Any, name: str) -> bool:
    try:
        docker_client.volumes.get(name)
    except NotFound:
        return False
    return True


def test_idle_unused_caches_go_and_used_or_recent_ones_stay(
    docker_client: Any, busybox_image: str, make_volume: Callable[[], str], tmp_path: Path
) -> None:
    janitor = CacheJanitor(docker_client, tmp_path, idle_days=14, free_bytes=lambda: 10**15)
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
    janitor = CacheJanitor(
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
