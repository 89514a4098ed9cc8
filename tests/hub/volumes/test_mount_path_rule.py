"""A renter chooses where their volumes are mounted: the agent's rule
(supplier_agent/mount_paths.py) refuses a system folder, an unnormalised path or a control
character at rent time, in words (issue 33)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rest_framework.test import APIClient

from hub.accounts.models import User
from hub.leases.models import Lease
from hub.volumes import services
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def renter() -> User:
    return f.make_user("renter")


def _rent(client: APIClient, host_id: int, volume_id: str, path: str) -> tuple[int, dict]:
    answer = client.post(
        "/api/v1/leases/",
        {
            "host_id": host_id,
            "gpu_indices": [0],
            "image": "busybox",
            "volumes": [{"volume_id": volume_id, "path": path}],
        },
        format="json",
    )
    return answer.status_code, answer.json()


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/proc", "the mount path '/proc' is /proc, a system folder"),
        ("/sys/fs/cgroup", "is inside /sys, a system folder"),
        ("/etc", "is /etc, a system folder"),
        ("/dev", "is /dev, a system folder"),
        ("/var/run/docker.sock", "is inside /var/run, a system folder"),
        ("/data\n--privileged", "'/data\\n--privileged' contains a control character"),
        ("/data/../etc", "is not in normal form"),
        ("//data", "is not in normal form"),
    ],
)
def test_the_api_refuses_a_mount_path_outside_the_rule_with_a_400(
    renter: User, path: str, words: str
) -> None:
    host = f.register_host()
    volume = services.create_volume(renter, host, "models", 10)
    client = APIClient()
    client.force_login(renter)

    status, body = _rent(client, host.pk, str(volume.pk), path)

    assert status == 400, body
    assert words in body["detail"]
    assert "e.g. /data" in body["detail"]  # what to write instead
    assert not Lease.objects.filter(renter=renter).exists()


def test_the_api_takes_a_folder_the_rule_allows(renter: User) -> None:
    host = f.register_host()
    volume = services.create_volume(renter, host, "models", 10)
    client = APIClient()
    client.force_login(renter)

    status, body = _rent(client, host.pk, str(volume.pk), "/root/.cache/huggingface")

    assert status == 201, body
    assert body["volumes"] == [{"volume_id": str(volume.pk), "path": "/root/.cache/huggingface"}]


def test_a_long_refused_path_is_shown_shortened(renter: User) -> None:
    host = f.register_host()
    volume = services.create_volume(renter, host, "models", 10)
    with pytest.raises(services.VolumeError) as caught:
        services.mounts_for_lease(renter, host, [(volume.pk, "/etc/" + "x" * 1000)])
    assert "is inside /etc" in str(caught.value)
    assert len(str(caught.value)) < 400
