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

``APIClient._get_raw_response_socket``'s answer, and the standard library's ``SocketIO._sock``
    A renter's terminal (supplier_agent.docker_exec) reads the exec's hijacked stream from the
    socket itself, so that closing the terminal can shut it down: :func:`exec_stream_socket`.
    docker-py returns the ``SocketIO`` of the response for local engines and the socket over
    TLS; dockerpty and the answers in docker-py's issues read ``._sock`` the same way.
    Upstream: https://github.com/docker/docker-py/issues/2255 and
    https://github.com/docker/docker-py/issues/2744 (the ``SocketIO`` is neither writable nor
    a socket), both open; when a release returns a writable socket, use that.
"""

from __future__ import annotations

import contextlib
import socket
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


def exec_stream_socket(stream: Any) -> socket.socket:
    """The socket under ``APIClient.exec_start(..., socket=True)``'s answer.

    For a local engine docker-py returns the response's ``socket.SocketIO`` (from
    ``APIClient._get_raw_response_socket``: ``response.raw._fp.fp.raw``), whose ``close()``
    leaves the connection open: a reader blocked in it wakes only when the socket itself is
    shut down, so a terminal the renter closed would keep its thread and the exec's stream.
    The standard library keeps that socket in ``SocketIO._sock``. Over TLS docker-py already
    returns the socket. tests/agent/test_compat_docker.py checks both against the pins.
    """
    if isinstance(stream, socket.socket):
        return stream
    inner = getattr(stream, "_sock", None)
    if not isinstance(inner, socket.socket):
        raise TypeError(f"exec_start returned {type(stream).__name__}, not a socket stream")
    return inner


def close_exec_stream(stream: Any) -> None:
    """Release everything behind an exec stream: the ``SocketIO``, the response docker-py
    hangs on it (``_response``, to keep TLS sockets alive) and the socket. ``SocketIO.close()``
    alone leaves the socket's descriptor to the garbage collector."""
    # The response first: closing it after the SocketIO raises ValueError (flush on a closed
    # file) before it lets go of its own reference.
    for close in (
        getattr(getattr(stream, "_response", None), "close", None),
        getattr(stream, "close", None),
        exec_stream_socket(stream).close,
    ):
        if close is not None:
            with contextlib.suppress(OSError, ValueError):
                close()
