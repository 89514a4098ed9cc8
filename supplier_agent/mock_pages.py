"""The mock runtime's stand-in services: a tiny HTTP page on each port a lease declares, bound
to a 127.0.0.1 host port like a real container's, so the demo's tunnel URLs show something.

Plain asyncio on the agent's event loop; one short page per request, then the connection closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import html
import logging

log = logging.getLogger(__name__)

# A request line plus headers larger than this, or slower than this, is not a browser's.
MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0


def page(lease_id: str, port: str) -> bytes:
    lease, port = html.escape(lease_id), html.escape(port)
    return (
        "<!doctype html>\n<html><head><meta charset=utf-8><title>CloudGPU mock rental</title>"
        "</head><body>\n"
        f"<h1>CloudGPU mock rental {lease}</h1>\n"
        f"<p>This is container port {port} of a lease on an agent in <code>--runtime mock"
        "</code>: no container runs, and this page stands in for the service you would run "
        "there. An agent in <code>--runtime docker</code> serves your image's own port.</p>\n"
        "</body></html>\n"
    ).encode()


class MockPages:
    """The servers of every lease this mock host runs: one per declared port."""

    def __init__(self) -> None:
        self._servers: dict[str, list[asyncio.Server]] = {}

    async def open(self, lease_id: str, ports: dict[str, int] | list[str]) -> dict[str, int]:
        """Serve each container port; a list picks free host ports, a mapping reuses them (a
        restarted agent adopting its leases). Returns container port -> host port."""
        await self.close(lease_id)
        wanted = ports if isinstance(ports, dict) else dict.fromkeys(ports, 0)
        opened: dict[str, int] = {}
        servers: list[asyncio.Server] = []
        for container_port, host_port in wanted.items():
            try:
                server = await asyncio.start_server(
                    functools.partial(_answer, body=page(lease_id, container_port)),
                    "127.0.0.1",
                    host_port,
                )
            except OSError as exc:
                # Only on adoption (a fixed port): someone else took it while we were down.
                log.warning(
                    "mock page for lease %s port %s on 127.0.0.1:%s: %s",
                    lease_id,
                    container_port,
                    host_port,
                    exc,
                )
                continue
            servers.append(server)
            opened[container_port] = int(server.sockets[0].getsockname()[1])
        self._servers[lease_id] = servers
        return opened

    async def close(self, lease_id: str) -> None:
        for server in self._servers.pop(lease_id, []):
            server.close()
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def close_all(self) -> None:
        for lease_id in list(self._servers):
            await self.close(lease_id)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_S)
        if len(head) > MAX_HEAD_BYTES:
            return
        method = head.split(b" ", 1)[0]
        headers = (
            "HTTP/1.1 200 OK\r\n"
            "Content-Type: text/html; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Cache-Control: no-store\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        writer.write(headers if method == b"HEAD" else headers + body)
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
        pass  # a client that went away or never sent a request: nothing to answer
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
