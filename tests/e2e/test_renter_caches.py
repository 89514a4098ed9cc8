"""Two renters of one template on one host, through the whole hub and a real Docker agent:
neither sees the other's cache, at the same time or one after the other, and each finds their
own again on their next lease."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from hub.accounts.models import User
from hub.leases import services as lease_services
from hub.leases.models import Lease
from hub.suppliers.models import Host
from tests.support import control_plane
from tests.support.docker_agent import docker_agent_online
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

# What a template with a cache path gives lease_spec(); start_lease makes it the renter's own.
TEMPLATE_CACHE = {"name": "template-demo", "path": "/cache"}


def _rent(renter: User, host: Host, gpu: int, image: str) -> Lease:
    # Each lease drops a file named after its renter in the cache, then stays up.
    write = 'touch "/cache/from-$RENTER"; exec sleep 600'
    spec = lease_services.LeaseSpec(
        image=image,
        env={"RENTER": renter.username},
        command=["sh", "-c", write],
        cache_volume=dict(TEMPLATE_CACHE),
    )
    lease = lease_services.start_lease(renter, host, [gpu], spec)
    started = wait_for(
        lambda: Lease.objects.filter(pk=lease.pk, state__in=["running", "failed"]).first(),
        timeout_s=120,
        what=f"the lease of {renter.username} running",
    )
    assert started.state == "running", started.failure_reason
    return started


def _cache_of(docker_client: Any, lease: Lease) -> set[str]:
    container = docker_client.containers.list(filters={"label": f"cloudgpu.lease={lease.pk}"})[0]
    listed = wait_for(
        lambda: container.exec_run(["ls", "/cache"]).output.decode().split() or None,
        timeout_s=30,
        what="the lease's own file in its cache",
    )
    return set(listed)


def _end(lease: Lease, docker_client: Any) -> None:
    lease_services.release_lease(lease.pk, Lease.EndReason.RENTER_STOP)
    wait_for(
        lambda: not control_plane.containers(docker_client, lease.pk),
        timeout_s=60,
        what="the lease's container removed",
    )


def test_two_renters_of_one_template_never_share_a_cache(
    tmp_path: Path, docker_client: Any, busybox_image: str
) -> None:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    alice = User.objects.create_user(username=f"alice{uuid.uuid4().hex[:6]}")
    bob = User.objects.create_user(username=f"bob{uuid.uuid4().hex[:6]}")
    volumes_before = {v.name for v in docker_client.volumes.list()}
    with hub_stack(tmp_path) as stack:
        try:
            with docker_agent_online(stack, tmp_path, supplier, gpu_count=2) as host:
                # At the same time, on the same host.
                alices, bobs = (
                    _rent(alice, host, 0, busybox_image),
                    _rent(bob, host, 1, busybox_image),
                )
                assert _cache_of(docker_client, alices) == {f"from-{alice.username}"}
                assert _cache_of(docker_client, bobs) == {f"from-{bob.username}"}
                _end(alices, docker_client)
                _end(bobs, docker_client)

                # One after the other: bob on alice's GPU sees only his own; alice finds hers.
                bobs_next = _rent(bob, host, 0, busybox_image)
                assert _cache_of(docker_client, bobs_next) == {f"from-{bob.username}"}
                _end(bobs_next, docker_client)
                alices_next = _rent(alice, host, 1, busybox_image)
                assert _cache_of(docker_client, alices_next) == {f"from-{alice.username}"}
                _end(alices_next, docker_client)
        finally:
            for volume in docker_client.volumes.list():
                if volume.name not in volumes_before and volume.name.startswith(
                    "cloudgpu-cache-renter-"
                ):
                    volume.remove(force=True)
