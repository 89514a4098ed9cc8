"""Issue 33 item 2: a renter cannot run the supplier's own images, on a real Docker engine.

A rental runs what was pulled from a registry for it, pulled without the supplier's Docker
credentials; an image that exists only on the host answers exactly as a missing one does, so a
renter cannot probe which private images the supplier keeps. The supplier may opt in to renting
their own images (``allow_local_images``): then the local copy runs, pinned by its id.

There is no registry on this machine, so what a pull from one records (``registry_digest``) is
checked on the shape Docker gives ``RepoDigests``.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from supplier_agent.containers import ContainerError, ContainerRuntime, registry_digest
from supplier_agent.protocol import DockerRun

pytestmark = pytest.mark.docker


@pytest.fixture
def private_image(docker_client: Any, busybox_image: str) -> Iterator[str]:
    """The supplier's own image: a tag that exists on this host and in no registry."""
    name = f"hold/ldlib-{uuid.uuid4().hex[:8]}"
    docker_client.images.get(busybox_image).tag(name, "latest")
    yield f"{name}:latest"
    docker_client.images.remove(f"{name}:latest", noprune=True)


def _spec(image: str) -> DockerRun:
    return DockerRun(
        command_id=str(uuid.uuid4()),
        lease_id=str(uuid.uuid4()),
        epoch=1,
        image=image,
        command=("sleep", "600"),
    )


def _refusal(runtime: ContainerRuntime, image: str, agent_id: str) -> str:
    spec = _spec(image)
    with pytest.raises(ContainerError) as refused:
        runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)
    assert runtime.find(spec.lease_id) is None  # nothing was created for it
    return str(refused.value).replace(image, "<image>")


def test_an_image_only_on_the_host_answers_as_a_missing_one(
    docker_client: Any, private_image: str, agent_id: str
) -> None:
    runtime = ContainerRuntime(docker_client, gpu_devices="none", stop_grace_s=1)
    missing = f"hold/ldlib-{uuid.uuid4().hex[:8]}:latest"
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(missing)

    present = _refusal(runtime, private_image, agent_id)
    absent = _refusal(runtime, missing, agent_id)

    assert present == absent
    # The image is still the supplier's: refusing it removed nothing.
    docker_client.images.get(private_image)


def test_with_the_suppliers_opt_in_a_local_image_runs_pinned_by_its_id(
    docker_client: Any, private_image: str, agent_id: str
) -> None:
    runtime = ContainerRuntime(
        docker_client, gpu_devices="none", stop_grace_s=1, allow_local_images=True
    )
    image_id = docker_client.images.get(private_image).id

    result = runtime.run(_spec(private_image), [0], agent_id=agent_id, ready_timeout_s=30)

    assert result.image_digest == image_id
    container = docker_client.containers.get(result.container_id)
    assert container.attrs["Image"] == image_id
    assert container.attrs["Config"]["Image"] == image_id  # the id, not the retaggable name


def test_pulls_never_send_the_suppliers_docker_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, docker_client: Any
) -> None:
    # The supplier logged in to Docker Hub on this host (`docker login` writes this file).
    secret = base64.b64encode(b"supplier:hub-password-123").decode()
    (tmp_path / "config.json").write_text(
        json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": secret}}})
    )
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    client = docker.from_env(timeout=30)
    sent: list[bytes] = []

    def record(response: Any, **_: Any) -> None:
        header = response.request.headers.get("X-Registry-Auth", b"")
        sent.append(header if isinstance(header, bytes) else header.encode())

    client.api.hooks["response"].append(record)
    try:
        runtime = ContainerRuntime(client, gpu_devices="none")
        with pytest.raises(ContainerError):  # no registry is reachable here
            runtime.pull(f"hold/private-{uuid.uuid4().hex[:8]}:latest")
    finally:
        client.close()

    assert sent, "the pull reached the engine"
    # docker-py would have sent the login above; the agent sends an empty one instead.
    assert all(json.loads(base64.urlsafe_b64decode(h + b"==")) == {} for h in sent), sent


@pytest.mark.parametrize(
    ("ref", "repo_digests", "expected"),
    [
        ("busybox", ["busybox@sha256:" + "a" * 64], "busybox@sha256:" + "a" * 64),
        # docker.io/library/busybox and busybox are one repository.
        (
            "busybox:1.36",
            ["docker.io/library/busybox@sha256:" + "b" * 64],
            "docker.io/library/busybox@sha256:" + "b" * 64,
        ),
        ("library/busybox:1.36", ["busybox@sha256:" + "c" * 64], "busybox@sha256:" + "c" * 64),
        (
            "ghcr.io/o/app:v1",
            ["ghcr.io/o/app@sha256:" + "d" * 64],
            "ghcr.io/o/app@sha256:" + "d" * 64,
        ),
        # Docker Hub by its other names.
        ("docker.io/python:3", ["python@sha256:" + "1" * 64], "python@sha256:" + "1" * 64),
        (
            "index.docker.io/library/python",
            ["python@sha256:" + "2" * 64],
            "python@sha256:" + "2" * 64,
        ),
        ("registry-1.docker.io/o/app", ["o/app@sha256:" + "3" * 64], "o/app@sha256:" + "3" * 64),
        # Pulled once from another repository and retagged here: not this name's registry copy.
        ("hold/ldlib:latest", ["busybox@sha256:" + "e" * 64], None),
        ("hold/ldlib:latest", [], None),
        (
            "quay.io:443/o/app",
            ["quay.io:443/o/app@sha256:" + "f" * 64],
            "quay.io:443/o/app@sha256:" + "f" * 64,
        ),
    ],
)
def test_the_digest_a_lease_records_is_of_the_repository_it_named(
    ref: str, repo_digests: list[str], expected: str | None
) -> None:
    assert registry_digest(ref, {"RepoDigests": repo_digests}) == expected
