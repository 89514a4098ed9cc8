"""A neighbour on the supplier's LAN, for tests: a network namespace joined to this host by a
veth pair, with a TCP listener on each of its addresses that answers every connection with a
marker and the address it was made to.

Made with iproute2 (``ip netns``, ``ip link``), so it needs root; removed afterwards even when
the test fails (deleting the link takes this host's routes through it along). Addresses come
from 10.213.0.0/16, one /24 per neighbour, plus any ``routed`` ones the caller names: the
neighbour holds those too and this host routes each to it, as to a router on its LAN.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.polling import wait_for

LISTENER = """
import socket, sys, threading
port, marker = int(sys.argv[1]), sys.argv[2]

def serve(address):
    server = socket.create_server((address, port))
    while True:
        conn, _ = server.accept()
        conn.sendall(f"{marker} {address}\\n".encode())
        conn.close()

for address in sys.argv[3:]:
    threading.Thread(target=serve, args=(address,)).start()
"""


@dataclass(frozen=True)
class Neighbour:
    name: str
    host_address: str  # this host's end of the link: a host address like the LAN one
    address: str  # the neighbour's
    network: str
    port: int
    marker: str
    routed: tuple[str, ...] = ()  # more of its addresses, which this host routes to it

    def run(self, *argv: str, timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        """A command inside the neighbour's namespace."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def connects(self, address: str, port: int) -> str:
        """What a TCP connection from the neighbour to address:port reads (empty: refused)."""
        code = (
            "import socket, sys\n"
            "try:\n"
            f"    s = socket.create_connection(({address!r}, {port}), timeout=3)\n"
            "    s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n')\n"
            "    print(s.recv(200).decode(errors='replace'))\n"
            "except OSError as exc:\n"
            "    print('', file=sys.stderr)\n"
        )
        return self.run(sys.executable, "-c", code).stdout.strip()


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def lan_neighbour(subnet: int, port: int = 8080, routed: Sequence[str] = ()) -> Iterator[Neighbour]:
    suffix = secrets.token_hex(3)
    name, host_end, ns_end = f"cgpu-lan-{suffix}", f"cgh{suffix}", f"cgn{suffix}"
    neighbour = Neighbour(
        name=name,
        host_address=f"10.213.{subnet}.1",
        address=f"10.213.{subnet}.2",
        network=f"10.213.{subnet}.0/24",
        port=port,
        marker=f"lan-{suffix}",
        routed=tuple(routed),
    )
    listener: subprocess.Popen[bytes] | None = None
    _ip("netns", "add", name)
    try:
        _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        _ip("link", "set", ns_end, "netns", name)
        _ip("addr", "add", f"{neighbour.host_address}/24", "dev", host_end)
        _ip("link", "set", host_end, "up")
        _ip("-n", name, "addr", "add", f"{neighbour.address}/24", "dev", ns_end)
        _ip("-n", name, "link", "set", ns_end, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        _ip("-n", name, "route", "add", "default", "via", neighbour.host_address)
        for address in neighbour.routed:
            # /32 each: a host route outranks whatever this host has for the range (its own
            # LAN may be one of them), and takes no more of it than the test needs.
            _ip("-n", name, "addr", "add", f"{address}/32", "dev", ns_end)
            _ip("route", "add", f"{address}/32", "via", neighbour.address, "dev", host_end)
        listener = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                name,
                sys.executable,
                "-c",
                LISTENER,
                str(port),
                neighbour.marker,
                neighbour.address,
                *neighbour.routed,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        addresses = (neighbour.address, *neighbour.routed)
        wait_for(
            lambda: all(neighbour.marker in neighbour.connects(a, port) for a in addresses),
            timeout_s=30,
            what="the neighbour's listeners",
        )
        yield neighbour
    finally:
        if listener is not None:
            listener.kill()
            listener.wait()
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
