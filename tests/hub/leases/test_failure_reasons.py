"""What a renter reads about a rental that never ran carries no host paths (issue 33), also when
an agent from before the agent's own redaction sends Docker's text whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hub.leases.models import Command, Lease
from hub.suppliers.models import Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

LAYER = "9b" * 32
OLD_AGENT_ERROR = (
    "failed to create task for container: failed to create shim task: OCI runtime create failed: "
    "runc create failed: unable to start container process: error during container init: "
    'error mounting "/var/lib/docker/volumes/cloudgpu-vol-' + "a" * 40 + '/_data" to rootfs at '
    '"/proc": mount /var/lib/docker/volumes/cloudgpu-vol-' + "a" * 40 + "/_data:/proc (via "
    f"/proc/self/fd/7), flags: 0x5000; rootfs /var/lib/docker/overlay2/{LAYER}/merged: "
    "operation not permitted: unknown"
)


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def host(db: None) -> Host:
    return f.register_host(gpus=[0])


def test_a_failed_start_is_stored_without_the_host_s_paths(host: Host) -> None:
    lease = f.start_lease(host)
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    run = f.command_of(lease, Command.Kind.DOCKER_RUN)

    assert f.ack(run, ok=False, error=OLD_AGENT_ERROR)

    lease.refresh_from_db()
    assert lease.state == Lease.State.FAILED
    assert "/var/lib/docker" not in lease.failure_reason
    assert "/proc/self" not in lease.failure_reason
    assert LAYER not in lease.failure_reason
    assert 'error mounting "<host path>" to rootfs at "/proc"' in lease.failure_reason
    assert "operation not permitted" in lease.failure_reason
    # The platform keeps the agent's whole answer on the command.
    run.refresh_from_db()
    assert run.error == OLD_AGENT_ERROR


def test_a_failed_reserve_is_stored_without_the_host_s_paths(host: Host) -> None:
    lease = f.start_lease(host)
    error = "cannot write /var/lib/cloudgpu-agent/claims.json: no space left on device"

    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), ok=False, error=error)

    lease.refresh_from_db()
    assert lease.failure_reason == "cannot write <host path>: no space left on device"
