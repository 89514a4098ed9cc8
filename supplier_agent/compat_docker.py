"""Every private name of the Docker SDK (``docker==7.1.0``, requirements/agent.txt) the agent uses.

Nothing else in the agent may touch an underscore name of ``docker``: a release that renames
one breaks this module alone, and tests/agent/test_compat_docker.py says which and what to
re-check. Like the rest of the agent, this module never imports Django or hub code.

``APIClient._url``, ``APIClient._get``, ``APIClient._get_result_tty``
    The log follower (``DockerRuntime.follow_logs``) needs a stream another thread can close:
    a reader blocked on a followed container's output wakes only when the socket is shut
    down. :func:`open_log_stream` builds the request ``APIClient.logs`` builds, with the TTY
    flag the caller already read from its own ``inspect_container`` (one inspect, which also
    turns a vanished container into a clean refusal before any request is sent), and wraps
    it in a ``CancellableStream`` as ``events()`` does. Upstream: the request for a way to
    interrupt a stream read, https://github.com/docker/docker-py/issues/272, was closed with
    docker-py 3.2.0, whose notes (https://github.com/docker/docker-py/pull/1979) made the streams of
    ``attach()``, ``logs()`` and ``events()`` cancellable, and in 7.1.0 the public
    ``APIClient.logs(stream=True)`` already returns a ``CancellableStream``
    (docker/api/container.py). So there is no upstream issue left to wait for: these three
    calls can be replaced by ``api.logs(container_id, stream=True, follow=True, ...)`` at the
    price of a second inspect per follow and a NotFound raised after the GET (whose response
    ``logs()`` then leaves open). When the pin moves, re-check that ``logs()`` still builds
    its request from these three calls in this order.

``CancellableStream._response``
    ``CancellableStream.close()`` shuts the socket down but leaves the ``requests`` response
    open, and its file object keeps the file descriptor: each stopped log follower or events
    reconnect leaked one fd. :func:`close_response` closes it. Upstream:
    https://github.com/docker/docker-py/issues/3345 (CancellableStream does not release its
    resources when closed) with the fix https://github.com/docker/docker-py/pull/3346, and the
    wider fd leak https://github.com/docker/docker-py/issues/2766; once a release closes the
    response itself, drop :func:`close_response`.
"""

from __future__ import annotations

from typing import Any

from docker import APIClient
from docker.types.daemon import CancellableStream


def open_log_stream(
    api: APIClient, container_id: str, params: dict[str, Any], *, tty: bool
) -> CancellableStream:
    """``GET /containers/<id>/logs`` as a stream another thread can close.

    ``params`` are the endpoint's query parameters (``follow``, ``tail``...). ``tty`` must be
    the container's ``Config.Tty``: a TTY container's output is raw, anyone else's is
    multiplexed with 8-byte frame headers, and reading one as the other garbles it.
    """
    url = api._url("/containers/{0}/logs", container_id)
    response = api._get(url, params=params, stream=True)
    return CancellableStream(api._get_result_tty(True, response, tty), response)


def close_response(stream: CancellableStream) -> None:
    """Release the file descriptor ``CancellableStream.close()`` leaves open."""
    stream._response.close()
