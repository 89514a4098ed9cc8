"""A renter's own volume through the whole hub and a real Docker agent (issue 13): what one
rental writes there the next one finds, the host reports its usage, and deleting it on the hub
removes it from the host's disk."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from hub.accounts.models import User
from hub.leases import services as lease_services
from hub.leases.models import Lease
from hub.suppliers.models import Host
from hub.volumes import services as volumes
from hub.volumes.models import Volume
from tests.support import control_plane
from tests.support.docker_agent import docker_agent_online
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


def _rent(renter: User, host: Host, volume: Volume, image: str, script: str) -> Lease:
    mounts = volumes.mounts_for_lease(renter, host, [(volume.pk, "/data")])
    spec = lease_services.LeaseSpec(
        image=image, command=["sh", "-c", script], volumes=volumes.wire_mounts(mounts)
    )
    lease = lease_services.start_lease(renter, host, [0], spec)
    started = wait_for(
        lambda: Lease.objects.filter(pk=lease.pk, state__in=["running", "failed"]).first(),
        timeout_s=120,
        what="the lease running",
    )
    assert started.state == "running", started.failure_reason
    return started


def _in_container(docker_client: Any, lease: Lease, argv: list[str]) -> str:
    container = docker_client.containers.list(filters={"label": f"cloudgpu.lease={lease.pk}"})[0]
    return container.exec_run(argv).output.decode()


def _end(lease: Lease, docker_client: Any) -> None:
    lease_services.release_lease(lease.pk, Lease.EndReason.RENTER_STOP)
    wait_for(
        lambda: not control_plane.containers(docker_client, lease.pk),
        timeout_s=60,
        what="the lease's container removed",
    )
    wait_for(
        lambda: Lease.objects.filter(pk=lease.pk, state="ended").exists(),
        timeout_s=60,
        what="the hub's record of the release",
    )


def _docker_volumes(docker_client: Any) -> set[str]:
    return {v.name for v in docker_client.volumes.list()}


def test_a_renters_volume_outlives_rentals_reports_usage_and_is_deleted_from_the_host(
    tmp_path: Path, docker_client: Any, busybox_image: str
) -> None:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    alice = User.objects.create_user(username=f"alice{uuid.uuid4().hex[:6]}")
    before = _docker_volumes(docker_client)
    with hub_stack(tmp_path) as stack:
        try:
            with docker_agent_online(stack, tmp_path, supplier) as host:
                volume = volumes.create_volume(alice, host, "datasets", 1)
                first = _rent(
                    alice,
                    host,
                    volume,
                    busybox_image,
                    "head -c 65536 /dev/zero > /data/weights.bin; exec sleep 600",
                )
                wait_for(
                    lambda: "weights.bin" in _in_container(docker_client, first, ["ls", "/data"]),
                    timeout_s=30,
                    what="the file written into the volume",
                )
                # One Docker volume, named by the hub's keyed hash: no renter, no label in it.
                docker_name = "cloudgpu-" + volume.wire_name
                assert docker_name in _docker_volumes(docker_client) - before
                assert alice.username not in docker_name
                assert "datasets" not in docker_name
                measured = wait_for(
                    lambda: Volume.objects.filter(pk=volume.pk, used_bytes__gte=65536).first(),
                    timeout_s=90,
                    what="the host's report of the volume's usage",
                )
                assert measured.measured_at is not None
                _end(first, docker_client)

                second = _rent(alice, host, volume, busybox_image, "exec sleep 600")
                listed = _in_container(docker_client, second, ["ls", "-l", "/data"])
                assert "weights.bin" in listed
                assert "65536" in listed
                with pytest.raises(volumes.VolumeError, match="stop it first"):
                    volumes.delete_volume(alice, volume.pk)
                _end(second, docker_client)

                # Deleting reaches the agent over its socket; its report closes the row.
                volumes.delete_volume(alice, volume.pk)
                gone = wait_for(
                    lambda: Volume.objects.filter(pk=volume.pk, state="removed").first(),
                    timeout_s=60,
                    what="the agent's report of the deleted volume",
                )
                assert gone.removed_reason == Volume.Reason.DELETED
                assert docker_name not in _docker_volumes(docker_client)
        finally:
            leftover = "cloudgpu-" + Volume.objects.get(renter=alice).wire_name
            if leftover in _docker_volumes(docker_client):
                docker_client.volumes.get(leftover).remove(force=True)
