"""A rental as a hostile tenant would use it, on real Docker, real iptables and a LAN neighbour
in a network namespace: it reaches neither the supplier's host nor the supplier's LAN, and the
LAN cannot reach it except through the tunnel's loopback port.

Image, memory, fork and warm-up attacks are in tests/agent/test_containers.py and
tests/agent/test_agent_docker.py; cache volumes per renter in tests/hub/leases.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from supplier_agent.containers import NETWORK, ContainerError, ContainerRuntime
from supplier_agent.egress import EgressPolicy
from supplier_agent.protocol import DockerRun
from tests.support.agents import AGENT, agent_env
from tests.support.netns import Neighbour, lan_neighbour
from tests.support.polling import wait_for

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def as_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CLOUDGPU_REQUIRE_DOCKER") == "1":
            pytest.fail("the hostile-tenant suite needs root (iptables, network namespaces)")
        pytest.skip("needs root: iptables and network namespaces")


def _runtime(docker_client: Any, allowed: tuple[str, ...] = ()) -> ContainerRuntime:
    # The test image exists only on this host: the supplier's opt-in to renting out such.
    return ContainerRuntime(
        docker_client,
        gpu_devices="none",
        stop_grace_s=1,
        egress=EgressPolicy(allowed),
        allow_local_images=True,
    )


@pytest.fixture
def neighbour() -> Iterator[Neighbour]:
    with lan_neighbour(subnet=7) as found:
        yield found


# One address in each IPv4 range of IANA's special-purpose registry that is not globally
# reachable and that Linux routes to a LAN neighbour like any other (10/8: the neighbour's own
# address). Not here, as no neighbour can hold them: 127/8 (martian off loopback, and
# CLOUDGPU-RAW besides), 224/4 (multicast) and 255.255.255.255 (broadcast);
# tests/agent/test_egress_ranges.py covers them with the rest of both registries.
SPECIAL_PURPOSE_V4 = (
    "0.213.0.2",  # "this network": Linux routes it (all of 0/8 but 0.0.0.0) since 5.3
    "100.64.213.2",
    "169.254.213.2",
    "172.16.213.2",
    "192.0.0.213",
    "192.0.2.213",
    "192.88.99.213",
    "192.168.213.2",
    "198.18.213.2",
    "198.51.100.213",
    "203.0.113.213",
    "240.0.0.213",  # reserved: Linux routes it as unicast
)


@pytest.fixture
def special_purpose_neighbour() -> Iterator[Neighbour]:
    with lan_neighbour(subnet=8, routed=SPECIAL_PURPOSE_V4) as found:
        yield found


@contextmanager
def host_listeners(addresses: list[str]) -> Iterator[tuple[int, str]]:
    """A TCP service of the supplier's host on each of these (internal) addresses, one port:
    (port, what it answers)."""
    marker = f"host-{uuid.uuid4().hex[:8]}"
    first = socket.create_server((addresses[0], 0))
    port = first.getsockname()[1]
    servers = [first, *(socket.create_server((a, port)) for a in addresses[1:])]
    stop = threading.Event()

    def serve(server: socket.socket) -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(marker.encode() + b"\n")

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield port, marker
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for server in servers:
            server.close()


def _host_addresses(docker_client: Any, neighbour: Neighbour) -> list[str]:
    """The lease bridge's gateway, Docker's default bridge (where there is one) and the host's
    end of the LAN link: addresses of this host that a rental might try."""
    found = [_gateway(docker_client), neighbour.host_address]
    ours = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    if " 172.17.0.1/" in ours:
        found.append("172.17.0.1")
    return found


def _lease(runtime: ContainerRuntime, image: str, agent_id: str, **fields: Any) -> Any:
    lease_id = str(uuid.uuid4())
    spec = DockerRun(
        command_id=str(uuid.uuid4()),
        lease_id=lease_id,
        epoch=1,
        image=image,
        ports=fields.pop("ports", ()),
        command=fields.pop("command", ("sleep", "600")),
    )
    result = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)
    return runtime.client.containers.get(result.container_id), result


def _reaches(container: Any, address: str, port: int) -> str:
    """What a TCP connection from inside the lease reads (empty when it cannot connect)."""
    out = container.exec_run(["sh", "-c", f"echo hi | nc -w 3 {address} {port}"])
    return out.output.decode(errors="replace")


def _answering(container: Any, neighbour: Neighbour, addresses: list[str]) -> set[str]:
    """Which of the neighbour's addresses answer a TCP connection from inside the lease; all
    tried at once, since each dropped one takes nc's whole 3 s."""
    tries = " ".join(f"(echo hi | nc -w 3 {address} {neighbour.port}) &" for address in addresses)
    out = container.exec_run(["sh", "-c", f"{tries} wait"]).output.decode(errors="replace")
    answers = [line.split() for line in out.splitlines()]
    return {words[1] for words in answers if len(words) == 2 and words[0] == neighbour.marker}


def _gateway(docker_client: Any) -> str:
    network = docker_client.networks.get(NETWORK)
    return str(network.attrs["IPAM"]["Config"][0]["Gateway"])


def test_a_lease_cannot_reach_any_address_of_the_suppliers_host(
    docker_client: Any, busybox_image: str, agent_id: str, neighbour: Neighbour
) -> None:
    container, _ = _lease(_runtime(docker_client), busybox_image, agent_id)
    addresses = _host_addresses(docker_client, neighbour)
    with host_listeners(addresses) as (port, marker):
        for address in addresses:
            # The host itself reaches its service there...
            with socket.create_connection((address, port), timeout=5) as own:
                assert own.recv(100).decode().strip() == marker
            # ...the rental does not.
            assert marker not in _reaches(container, address, port), address


def test_a_lease_cannot_reach_the_lan_unless_the_supplier_allows_that_range(
    docker_client: Any, busybox_image: str, agent_id: str, neighbour: Neighbour
) -> None:
    container, _ = _lease(_runtime(docker_client), busybox_image, agent_id)
    assert neighbour.marker not in _reaches(container, neighbour.address, neighbour.port)

    # The supplier allows that range: the same lease reaches it (the route was there all along).
    # Allowed again on each try: `make test` runs the Docker tests on two workers, and another
    # agent's lease start rewrites the chain with its own (default) ranges meanwhile.
    def reached_once_allowed() -> bool:
        _runtime(docker_client, allowed=(neighbour.network,)).ensure_egress()
        return neighbour.marker in _reaches(container, neighbour.address, neighbour.port)

    wait_for(reached_once_allowed, timeout_s=60, what="the allowed range reached")

    _runtime(docker_client).ensure_egress()
    assert neighbour.marker not in _reaches(container, neighbour.address, neighbour.port)


def test_a_lease_reaches_no_special_purpose_ipv4_range(
    docker_client: Any, busybox_image: str, agent_id: str, special_purpose_neighbour: Neighbour
) -> None:
    neighbour = special_purpose_neighbour
    addresses = [neighbour.address, *neighbour.routed]
    # The host reaches the neighbour's listener on every one of them...
    for address in addresses:
        with socket.create_connection((address, neighbour.port), timeout=5) as own:
            assert own.recv(100).decode().split() == [neighbour.marker, address]
    container, _ = _lease(_runtime(docker_client), busybox_image, agent_id)

    # ...the rental on none.
    assert _answering(container, neighbour, addresses) == set()

    # The filter is what stops it: with them all allowed, every one answers the same lease.
    try:
        allowed = tuple(f"{address}/32" for address in addresses)
        _runtime(docker_client, allowed=allowed).ensure_egress()
        assert _answering(container, neighbour, addresses) == set(addresses)
    finally:
        _runtime(docker_client).ensure_egress()


def test_a_lan_neighbour_reaches_a_lease_port_only_through_the_loopback(
    docker_client: Any, busybox_image: str, agent_id: str, neighbour: Neighbour
) -> None:
    httpd = "mkdir -p /www && echo lease-page > /www/index.html && exec httpd -f -p 8080 -h /www"
    container, result = _lease(
        _runtime(docker_client),
        busybox_image,
        agent_id,
        ports=(8080,),
        command=("sh", "-c", httpd),
    )
    container.reload()
    lease_address = container.attrs["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]
    subnet = docker_client.networks.get(NETWORK).attrs["IPAM"]["Config"][0]["Subnet"]
    # The neighbour routes the lease subnet through the host, as a LAN router could.
    assert (
        neighbour.run("ip", "route", "add", subnet, "via", neighbour.host_address).returncode == 0
    )

    assert "lease-page" not in neighbour.connects(lease_address, 8080)
    assert "lease-page" not in neighbour.connects(neighbour.host_address, result.ports[8080])
    # The way the tunnel comes in still works.
    page = httpx.get(f"http://127.0.0.1:{result.ports[8080]}/", timeout=10)
    assert page.text.strip() == "lease-page"


def test_packets_for_loopback_from_other_interfaces_are_dropped_before_routing(
    docker_client: Any,
) -> None:
    runtime = _runtime(docker_client)
    bridge = runtime.ensure_egress()
    assert bridge is not None
    assert runtime.egress is not None
    assert runtime.egress.missing(bridge) == []
    rule = subprocess.run(
        ["iptables", "-t", "raw", "-S", "CLOUDGPU-RAW"], capture_output=True, text=True, check=True
    ).stdout
    assert "! -i lo" in rule
    assert "-d 127.0.0.0/8" in rule
    assert "-j DROP" in rule


def test_doctor_reports_the_filter_in_place(docker_client: Any) -> None:
    _runtime(docker_client).ensure_egress()

    out = subprocess.run(
        [AGENT, "doctor"], env=agent_env(), capture_output=True, text=True, timeout=120, check=False
    ).stdout

    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}
    assert rows.get("egress") == "ok", out


def test_without_a_packet_filter_the_host_takes_no_rentals(
    docker_client: Any,
    busybox_image: str,
    agent_id: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no iptables on this "host"

    with pytest.raises(ContainerError, match="cannot keep rentals off its own network"):
        _lease(_runtime(docker_client), busybox_image, agent_id)
