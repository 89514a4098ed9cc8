from __future__ import annotations

import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # The hub pools its connections per process; this process makes and drops the test database
    # (a pool opened before that would keep lending connections to the wrong one), so it
    # connects per use. The hubs the tests start (tests/support/hub_stack.py) run with the pool.
    from django.conf import settings

    settings.DATABASES["default"]["OPTIONS"].pop("pool", None)
    # Sign-ups are throttled per address across runs (Redis keeps the counters); only
    # tests/hub/web/test_login_limits.py, which lowers it, tests the throttle.
    settings.SIGNUP_RATE_LIMIT = 100_000


BUSYBOX_STATIC = Path("/bin/busybox")
TEST_IMAGE = "cloudgpu-test/busybox:latest"


def _docker_unavailable(reason: str) -> None:
    if os.environ.get("CLOUDGPU_REQUIRE_DOCKER") == "1":
        pytest.fail(f"CLOUDGPU_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[object]:
    """A client for the real Docker engine; skips (or fails under CI) without one."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except DockerException as exc:
        _docker_unavailable(f"no Docker engine reachable ({exc})")
    yield client
    client.close()


@pytest.fixture(scope="session")
def busybox_image(docker_client: object) -> str:
    """A tiny image built locally from Debian's busybox-static: no registry is reachable."""
    if not BUSYBOX_STATIC.is_file():
        _docker_unavailable(f"{BUSYBOX_STATIC} is missing (apt-get install busybox-static)")
    dockerfile = (
        b"FROM scratch\n"
        b"COPY busybox /bin/busybox\n"
        b'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
        b'CMD ["/bin/sh"]\n'
    )
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), ("busybox", BUSYBOX_STATIC.read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    docker_client.images.build(fileobj=context, custom_context=True, tag=TEST_IMAGE, rm=True)  # type: ignore[attr-defined]
    return TEST_IMAGE


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A fresh hub state folder that an unprivileged service user can enter.

    pytest's tmp_path lives under a 0700 folder; the embedded Postgres runs as a system user
    when the tests run as root, so the folder is made under a traversable /tmp path instead.
    """
    parent = Path(tempfile.mkdtemp(prefix="cloudgpu-test-"))
    parent.chmod(0o755)
    try:
        yield parent / "state"
    finally:
        shutil.rmtree(parent, ignore_errors=True)
