"""The Docker engine that agent tests rely on, with the locally built busybox image."""

from __future__ import annotations

import uuid

import httpx
import pytest

from tests.support.polling import wait_for

pytestmark = pytest.mark.docker


def test_busybox_image_runs_and_publishes_a_port_on_loopback(
    docker_client: object, busybox_image: str
) -> None:
    marker = uuid.uuid4().hex
    container = docker_client.containers.run(  # type: ignore[attr-defined]
        busybox_image,
        ["sh", "-c", f"mkdir /www && echo {marker} > /www/index.html && httpd -f -p 8080 -h /www"],
        detach=True,
        ports={"8080/tcp": ("127.0.0.1", None)},
        labels={"cloudgpu.test": "1"},
    )
    try:

        def host_port() -> str | None:
            container.reload()
            bindings = container.attrs["NetworkSettings"]["Ports"].get("8080/tcp") or []
            return bindings[0]["HostPort"] if bindings else None

        port = wait_for(host_port, timeout_s=30, what="the published port")

        def page() -> str | None:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/", timeout=2).text
            except httpx.HTTPError:
                return None

        assert wait_for(page, timeout_s=30, what="busybox httpd").strip() == marker
    finally:
        container.remove(force=True)
