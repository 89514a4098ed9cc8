"""The Docker SDK internals supplier_agent.compat_docker relies on still exist with their shape.

Each failure names the internal and what to re-check: these fail when the ``docker`` pin
(requirements/agent.txt) moves to a release that changed them, before an agent does.
"""

from __future__ import annotations

import inspect
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import pytest
from docker import APIClient
from docker.types.daemon import CancellableStream

from supplier_agent.compat_docker import close_response, open_log_stream

RECHECK = (
    "docker {version}: {what} changed; re-check supplier_agent/compat_docker.py "
    "(its docstring says why the agent uses it and which upstream issue to watch)"
)


def _recheck(what: str) -> str:
    return RECHECK.format(version=docker.__version__, what=what)


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_api_client_still_has_the_request_helpers_open_log_stream_calls() -> None:
    assert _parameters(APIClient._url)[:2] == ["self", "pathfmt"], _recheck("APIClient._url")
    # `_get` is wrapped by `update_headers` (*args, **kwargs); it forwards to requests' get.
    assert callable(getattr(APIClient, "_get", None)), _recheck("APIClient._get")
    assert _parameters(APIClient._get_result_tty) == ["self", "stream", "res", "is_tty"], _recheck(
        "APIClient._get_result_tty"
    )
    client = APIClient(base_url="unix:///var/run/docker.sock", version="1.41")
    try:
        url = client._url("/containers/{0}/logs", "abc")
    finally:
        client.close()
    assert url.endswith("/v1.41/containers/abc/logs"), _recheck("APIClient._url's result")


def test_api_client_logs_still_builds_its_request_from_the_same_calls() -> None:
    # open_log_stream is APIClient.logs(stream=True) with the TTY flag passed in; if logs()
    # builds its request another way, ours no longer matches what the engine expects.
    source = inspect.getsource(APIClient.logs)
    for call in (
        'self._url("/containers/{0}/logs", container)',
        "self._get(url, params=params, stream=stream)",
        "self._get_result(container, stream, res)",
        "CancellableStream(output, res)",
    ):
        assert call in source, _recheck(f"APIClient.logs no longer does {call}")
    assert "self._get_result_tty(stream, res, self._check_is_tty(container))" in (
        inspect.getsource(APIClient._get_result)
    ), _recheck("APIClient._get_result")


def test_cancellable_stream_still_keeps_the_response_and_leaves_it_open_on_close() -> None:
    assert _parameters(CancellableStream.__init__) == ["self", "stream", "response"], _recheck(
        "CancellableStream.__init__"
    )
    response = object()
    assert CancellableStream(iter(()), response)._response is response, _recheck(
        "CancellableStream._response"
    )
    # When a release closes the response itself (docker/docker-py#3346), close_response can go.
    assert "self._response.close()" not in inspect.getsource(CancellableStream.close), _recheck(
        "CancellableStream.close now closes the response: drop compat_docker.close_response"
    )


@pytest.fixture
def chatty_container(docker_client: Any, busybox_image: str) -> Iterator[Any]:
    container = docker_client.containers.run(
        busybox_image,
        ["sh", "-c", "echo first; echo second; sleep 60"],
        detach=True,
        name=f"cloudgpu-compat-{uuid.uuid4().hex[:8]}",
    )
    try:
        yield container
    finally:
        container.remove(force=True)


def test_open_log_stream_follows_output_and_closes_from_another_thread(
    docker_client: Any, chatty_container: Any
) -> None:
    api = docker_client.api
    params = {"stdout": 1, "stderr": 1, "follow": 1, "timestamps": 0, "tail": 10}
    stream = open_log_stream(api, chatty_container.id, params, tty=False)
    received: list[bytes] = []
    first_two = threading.Event()

    def read() -> None:
        try:
            for data in stream:  # blocks in `sleep 60` until closed
                received.append(data)
                if b"second" in b"".join(received):
                    first_two.set()
        except Exception:  # a read under a shut socket ends in whatever urllib3 raises
            return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first_two.wait(20), f"no demultiplexed output: {received!r}"
    stream.close()
    close_response(stream)
    reader.join(10)
    assert not reader.is_alive(), "closing the stream did not wake its reader"
    assert b"".join(received) == b"first\nsecond\n"
    assert stream._response.raw.closed
