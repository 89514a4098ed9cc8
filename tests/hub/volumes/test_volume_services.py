"""Renters' volumes on the hub (issue 13): owned by one renter, mounted only into their leases
on the volume's host, deleted through the agent, and what agents report shown to the owner."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from hub.accounts.models import User
from hub.leases import services as leases
from hub.leases.models import Command, Lease
from hub.lib import channel_send
from hub.volumes import services
from hub.volumes.models import Volume
from supplier_agent.protocol import VolumeRemoval, VolumeReport, VolumeUsage, parse_message
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

GIB = 1024**3


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def renter() -> User:
    return f.make_user("renter")


def _volume(renter: User, host: Any, label: str = "models", size_gib: int = 10) -> Volume:
    return services.create_volume(renter, host, label, size_gib)


def _rent_with(renter: User, host: Any, volume: Volume, path: str = "/data") -> Lease:
    mounts = services.mounts_for_lease(renter, host, [(volume.pk, path)])
    return leases.start_lease(renter, host, [0], f.lease_spec(volumes=services.wire_mounts(mounts)))


def test_a_volume_belongs_to_one_renter_and_its_wire_name_says_nothing(renter: User) -> None:
    host = f.register_host()
    volume = _volume(renter, host)
    assert volume.wire_name.startswith("vol-")
    assert len(volume.wire_name) == 44
    assert "models" not in volume.wire_name
    other = f.make_user("other")
    with pytest.raises(services.VolumeError, match="no such volume"):
        services.mounts_for_lease(other, host, [(volume.pk, "/data")])
    with pytest.raises(services.VolumeError, match="no such volume"):
        services.delete_volume(other, volume.pk)


@pytest.mark.parametrize(
    ("label", "size", "words"),
    [
        ("", 10, "volume name"),
        ("../etc", 10, "volume name"),
        ("a\x00b", 10, "volume name"),
        ("x" * 65, 10, "volume name"),
        ("ok", 0, "size"),
        ("ok", 10**9, "size"),
    ],
)
def test_bad_volume_requests_are_refused_in_words(
    renter: User, label: str, size: int, words: str
) -> None:
    with pytest.raises(services.VolumeError, match=words):
        services.create_volume(renter, f.register_host(), label, size)
    assert not Volume.objects.filter(renter=renter).exists()


def test_names_are_unique_per_host_and_the_count_is_capped(renter: User, settings: Any) -> None:
    settings.VOLUME_MAX_PER_RENTER = 2
    host = f.register_host()
    _volume(renter, host, "a")
    with pytest.raises(services.VolumeError, match="already have a volume called"):
        _volume(renter, host, "a")
    _volume(renter, f.register_host(), "a")  # another host: fine
    with pytest.raises(services.VolumeError, match="delete one first"):
        _volume(renter, host, "b")


def test_a_lease_mounts_the_volume_and_the_agent_is_told_its_size(renter: User) -> None:
    host = f.register_host()
    volume = _volume(renter, host, size_gib=3)
    lease = _rent_with(renter, host, volume)
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE))
    run = f.command_of(lease, Command.Kind.DOCKER_RUN)
    assert run.payload["volumes"] == [
        {"name": volume.wire_name, "path": "/data", "size_bytes": 3 * GIB}
    ]
    # The agent's own parser takes what the hub sends.
    assert parse_message(json.dumps(run.payload)).volumes[0].name == volume.wire_name
    volume.refresh_from_db()
    assert volume.first_mounted_at is not None


@pytest.mark.parametrize("case", ["other host", "removed", "over cap", "bad path", "twice"])
def test_a_volume_that_cannot_be_mounted_is_refused(renter: User, case: str) -> None:
    host = f.register_host()
    volume = _volume(renter, host)
    wanted = [(volume.pk, "/data")]
    target = host
    if case == "other host":
        target = f.register_host()
    elif case == "removed":
        Volume.objects.filter(pk=volume.pk).update(state=Volume.State.REMOVED)
    elif case == "over cap":
        Volume.objects.filter(pk=volume.pk).update(over_cap=True)
    elif case == "bad path":
        wanted = [(volume.pk, "/data/../etc")]
    else:
        wanted = [(volume.pk, "/a"), (volume.pk, "/b")]
    with pytest.raises(services.VolumeError):
        services.mounts_for_lease(renter, target, wanted)


def test_a_volume_deleted_while_a_rent_races_it_is_not_mounted(renter: User) -> None:
    host = f.register_host()
    volume = _volume(renter, host)
    mounts = services.mounts_for_lease(renter, host, [(volume.pk, "/data")])
    services.delete_volume(renter, volume.pk)  # never mounted: removed at once
    with pytest.raises(leases.LeaseError, match="just deleted"):
        leases.start_lease(renter, host, [0], f.lease_spec(volumes=services.wire_mounts(mounts)))
    assert not Lease.objects.filter(renter=renter).exists()


def _receive(channel: str) -> dict[str, Any]:
    async def receive() -> dict[str, Any]:
        import asyncio

        return await asyncio.wait_for(get_channel_layer().receive(channel), timeout=10)

    return async_to_sync(receive)()


def test_deleting_a_used_volume_goes_through_the_agent(renter: User) -> None:
    channel = async_to_sync(get_channel_layer().new_channel)()
    host = f.register_host(channel_name=channel)
    volume = _volume(renter, host)
    lease = _rent_with(renter, host, volume)
    with pytest.raises(services.VolumeError, match="stop it first"):
        services.delete_volume(renter, volume.pk)
    leases.release_lease(lease.pk)
    assert f.ack(f.command_of(lease, Command.Kind.RELEASE))
    try:
        from django.db import transaction

        with transaction.atomic():
            services.delete_volume(renter, volume.pk)
        # on_commit does not fire inside the test's transaction: send as it would.
        channel_send.send(
            channel, {"type": "agent.command", "frame": services.pending_deletes(host.pk)[0]}
        )
        frame = json.loads(_receive(channel)["frame"])
    finally:
        channel_send.close()
    assert frame == {"type": "volume_delete", "v": 1, "name": volume.wire_name}
    volume.refresh_from_db()
    assert volume.state == Volume.State.DELETING
    # The agent confirms; repeating the confirmation changes nothing.
    report = VolumeReport(
        removed=(VolumeRemoval(name=volume.wire_name, reason="deleted", at=1.0e9),)
    )
    assert services.apply_report(host.pk, report) == 1
    assert services.apply_report(host.pk, report) == 0
    volume.refresh_from_db()
    assert (volume.state, volume.removed_reason) == ("removed", "deleted")
    assert services.pending_deletes(host.pk) == []


def test_reports_update_usage_and_say_why_a_volume_or_cache_went(renter: User) -> None:
    host = f.register_host()
    volume = _volume(renter, host, size_gib=1)
    lease = leases.start_lease(
        renter,
        host,
        [0],
        f.lease_spec(cache_volume={"name": "comfy", "path": "/root"}),
    )
    cache = Volume.objects.get(renter=renter, kind=Volume.Kind.CACHE)
    assert cache.wire_name == lease.cache_volume["name"]
    report = VolumeReport(
        volumes=(
            VolumeUsage(
                name=volume.wire_name, bytes=2 * GIB, in_use=False, last_used=1e9, over_cap=True
            ),
            VolumeUsage(name=cache.wire_name, bytes=5, in_use=True, last_used=1e9),
        ),
        removed=(),
    )
    services.apply_report(host.pk, report)
    volume.refresh_from_db()
    assert (volume.used_bytes, volume.over_cap) == (2 * GIB, True)
    with pytest.raises(services.VolumeError, match="more than its size"):
        services.mounts_for_lease(renter, host, [(volume.pk, "/data")])

    # Another host cannot touch these volumes by naming them.
    stranger = f.register_host()
    services.apply_report(
        stranger.pk,
        VolumeReport(removed=(VolumeRemoval(name=cache.wire_name, reason="idle", at=1e9),)),
    )
    cache.refresh_from_db()
    assert cache.state == Volume.State.ACTIVE

    services.apply_report(
        host.pk,
        VolumeReport(removed=(VolumeRemoval(name=cache.wire_name, reason="disk_low", at=1e9),)),
    )
    client = Client()
    client.force_login(renter)
    page = client.get(reverse("web:volumes")).content.decode()
    assert "the host ran short of disk" in page
    assert "over its size" in page


def test_the_api_creates_lists_mounts_and_deletes_volumes(renter: User) -> None:
    host = f.register_host()
    client = APIClient()
    client.force_login(renter)
    made = client.post(
        "/api/v1/volumes/", {"host_id": host.pk, "name": "data", "size_gib": 5}, format="json"
    )
    assert made.status_code == 201, made.content
    volume_id = made.json()["id"]
    assert made.json()["size_cap_bytes"] == 5 * GIB
    assert "wire_name" not in made.json()
    listed = client.get("/api/v1/volumes/").json()
    assert [v["id"] for v in listed] == [volume_id]
    rent = client.post(
        "/api/v1/leases/",
        {
            "host_id": host.pk,
            "gpu_indices": [0],
            "image": "busybox",
            "volumes": [{"volume_id": volume_id, "path": "/work"}],
        },
        format="json",
    )
    assert rent.status_code == 201, rent.content
    assert rent.json()["volumes"] == [{"volume_id": volume_id, "path": "/work"}]
    # Someone else's volume id reads as a volume that does not exist.
    stranger = APIClient()
    stranger.force_login(f.make_user("stranger"))
    assert stranger.get(f"/api/v1/volumes/{volume_id}/").status_code == 404
    assert stranger.delete(f"/api/v1/volumes/{volume_id}/").status_code == 404
    stolen = stranger.post(
        "/api/v1/leases/",
        {
            "host_id": host.pk,
            "gpu_indices": [1],
            "image": "busybox",
            "volumes": [{"volume_id": volume_id, "path": "/work"}],
        },
        format="json",
    )
    assert stolen.status_code == 400
    assert "no such volume" in stolen.json()["detail"]
    refused = client.delete(f"/api/v1/volumes/{volume_id}/")
    assert refused.status_code == 400
    assert "stop it first" in refused.json()["detail"]


def test_the_web_page_creates_a_volume_and_the_rent_page_mounts_it(renter: User) -> None:
    host = f.register_host()
    client = Client()
    client.force_login(renter)
    response = client.post(
        reverse("web:volumes"), {"host": host.pk, "name": "models", "size_gib": "20"}
    )
    assert response.status_code == 302
    volume = Volume.objects.get(renter=renter)
    gpu = host.gpus.get()
    page = client.get(reverse("web:rent", args=[gpu.pk])).content.decode()
    assert "models (20 GiB)" in page
    response = client.post(
        reverse("web:rent", args=[gpu.pk]),
        {
            "image": "busybox",
            "volume": str(volume.pk),
            "volume_path": "/models",
            "seen_price_micros": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()[-2000:]
    lease = Lease.objects.get(renter=renter)
    assert lease.volumes == [{"name": volume.wire_name, "path": "/models", "size_bytes": 20 * GIB}]
    # Bad input keeps everything: an oversized volume is refused with the form.
    too_big = client.post(
        reverse("web:volumes"), {"host": host.pk, "name": "huge", "size_gib": "100000"}
    )
    assert too_big.status_code == 400
    assert Volume.objects.filter(renter=renter).count() == 1


def test_a_removed_volume_leaves_its_row_for_the_reason(renter: User) -> None:
    host = f.register_host()
    volume = _volume(renter, host)
    Volume.objects.filter(pk=volume.pk).update(first_mounted_at=timezone.now() - timedelta(days=20))
    services.apply_report(
        host.pk,
        VolumeReport(removed=(VolumeRemoval(name=volume.wire_name, reason="idle", at=1e9),)),
    )
    volume.refresh_from_db()
    assert volume.state == Volume.State.REMOVED
    assert volume.removed_reason == "idle"
    with pytest.raises(services.VolumeError, match="was removed"):
        services.mounts_for_lease(renter, host, [(volume.pk, "/data")])
    # Its name is free again on that host.
    assert _volume(renter, host).label == "models"


def test_a_volume_over_its_size_gets_a_larger_one_and_mounts_again(renter: User) -> None:
    host = f.register_host()
    volume = _volume(renter, host, size_gib=1)
    services.apply_report(
        host.pk,
        VolumeReport(
            volumes=(
                VolumeUsage(
                    name=volume.wire_name, bytes=3 * GIB, in_use=False, last_used=1e9, over_cap=True
                ),
            )
        ),
    )
    with pytest.raises(services.VolumeError, match="larger size"):
        services.mounts_for_lease(renter, host, [(volume.pk, "/data")])
    client = APIClient()
    client.force_login(renter)
    too_small = client.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gib": 2}, format="json")
    assert too_small.status_code == 200
    assert too_small.json()["over_cap"] is True  # 3 GiB still do not fit in 2
    grown = client.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gib": 4}, format="json")
    assert grown.json()["over_cap"] is False
    lease = _rent_with(renter, host, volume)
    assert lease.volumes[0]["size_bytes"] == 4 * GIB  # the agent checks against the new size
    stranger = APIClient()
    stranger.force_login(f.make_user("stranger"))
    assert (
        stranger.patch(f"/api/v1/volumes/{volume.pk}/", {"size_gib": 9}, format="json").status_code
        == 404
    )
