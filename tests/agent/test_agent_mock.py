"""A real agent process (``--runtime mock``) against a protocol peer on loopback: the
session logic — register, heartbeat, commands exactly once, errors, reconnects."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from tests.support.agents import configure, new_token, running_agent
from tests.support.hub_peer import HubPeer, PeerConnection


def _lease() -> str:
    return str(uuid.uuid4())


@dataclass
class Session:
    hub: HubPeer
    conn: PeerConnection
    agent: subprocess.Popen[bytes]
    state: Path
    token: str


@contextmanager
def mock_agent(tmp_path: Path) -> Iterator[Session]:
    """A configured mock agent, running and registered with a fresh protocol peer."""
    token = new_token()
    state = tmp_path / "state"
    with HubPeer(token) as hub:
        assert configure(state, hub.url, token, "--runtime", "mock").returncode == 0
        with running_agent(state, tmp_path / "agent.log") as agent:
            conn = hub.wait_for_connection()
            hub.wait_for(conn, "register")
            yield Session(hub, conn, agent, state, token)


def test_agent_registers_heartbeats_and_serves_a_lease(tmp_path: Path) -> None:
    with mock_agent(tmp_path) as session:
        hub, conn = session.hub, session.conn
        register = hub.wait_for(conn, "register")
        assert register.agent_id == (session.state / "agent_id").read_text().strip()
        assert [g.name for g in register.gpus] == ["NVIDIA GeForce RTX 4090"]
        hub.wait_for(conn, "heartbeat")

        lease = _lease()
        reserved = hub.command(conn, "reserve", lease, 1, gpus="0")
        assert reserved.ok, reserved.error
        assert reserved.result["gpu_indices"] == [0]
        started = hub.command(conn, "docker_run", lease, 1, image="busybox:latest", ports=[80])
        assert started.ok, started.error
        assert set(started.result["ports"]) == {"80"}
        hub.wait_for(conn, "heartbeat", lambda m: [c.lease_id for c in m.claims] == [lease])
        released = hub.command(conn, "release", lease, 1, reason="renter_stop")
        assert released.ok, released.error

        # The token reached the agent through its 0600 config file, never its argv.
        assert session.token not in " ".join(psutil.Process(session.agent.pid).cmdline())
    assert session.token not in (tmp_path / "agent.log").read_text()


def _refused(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
    except httpx.ConnectError:
        return True
    return False


def test_mock_leases_serve_a_page_on_each_port_until_released(tmp_path: Path) -> None:
    with mock_agent(tmp_path) as session:
        hub, conn = session.hub, session.conn
        lease, other = _lease(), _lease()
        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        started = hub.command(conn, "docker_run", lease, 1, image="x", ports=[80, 8888])
        assert started.ok, started.error
        ports = started.result["ports"]
        assert set(ports) == {"80", "8888"}
        assert len(set(ports.values())) == 2  # host ports of their own, like a container's
        for container_port, host_port in ports.items():
            page = httpx.get(f"http://127.0.0.1:{host_port}/any/path?q=1", timeout=10)
            assert page.status_code == 200
            assert page.headers["content-type"].startswith("text/html")
            assert lease in page.text
            assert f"container port {container_port}" in page.text
        assert httpx.head(f"http://127.0.0.1:{ports['80']}/", timeout=10).content == b""

        # A second lease (after the first is released: the mock host has one GPU) gets its own.
        assert hub.command(conn, "release", lease, 1).ok
        for host_port in ports.values():
            assert _refused(host_port), "a released lease's page still answers"
        assert hub.command(conn, "reserve", other, 2, gpus="0").ok
        again = hub.command(conn, "docker_run", other, 2, image="x", ports=[80])
        assert other in httpx.get(f"http://127.0.0.1:{again.result['ports']['80']}/").text


def test_a_repeated_command_has_one_effect_and_the_same_answer(tmp_path: Path) -> None:
    with mock_agent(tmp_path) as session:
        hub, conn = session.hub, session.conn
        first, second = _lease(), _lease()
        command_id = str(uuid.uuid4())
        assert hub.command(conn, "reserve", first, 1, gpus="0", command_id=command_id).ok
        assert hub.command(conn, "release", first, 1).ok
        # Same command id again: the stored answer, not a second reserve (which would
        # otherwise succeed now that GPU 0 is free again).
        hub.send(
            conn,
            {
                "type": "reserve",
                "command_id": command_id,
                "lease_id": first,
                "epoch": 1,
                "gpus": "0",
            },
        )
        acks = hub.wait(
            lambda: len([m for m in conn.received if getattr(m, "command_id", None) == command_id])
            == 2
            and [m for m in conn.received if getattr(m, "command_id", None) == command_id],
            what="the repeated ack",
        )
        assert acks[0] == acks[1]
        # GPU 0 is free: the repeat did not claim it again for the first lease.
        assert hub.command(conn, "reserve", second, 2, gpus="0").ok


def test_stale_epoch_and_bad_frames_are_refused_and_the_connection_goes_on(tmp_path: Path) -> None:
    with mock_agent(tmp_path) as session:
        hub, conn = session.hub, session.conn
        lease = _lease()
        assert hub.command(conn, "reserve", lease, 5, gpus="0").ok
        assert hub.command(conn, "release", lease, 5).ok
        stale = hub.command(conn, "reserve", _lease(), 4, gpus="0")
        assert not stale.ok
        assert "stale epoch 4" in stale.error

        for bad in ("{not json", '{"type": "reserve", "v": 1}', '{"type": "launch", "v": 1}'):
            hub.send(conn, bad)
        errors = hub.wait(
            lambda: len([m for m in conn.received if getattr(m, "TYPE", "") == "error"]) >= 3
            and [m for m in conn.received if getattr(m, "TYPE", "") == "error"],
            what="three error replies",
        )
        reasons = " | ".join(e.reason for e in errors)
        assert "not valid JSON" in reasons
        assert "reserve.command_id" in reasons
        assert "unknown message type 'launch'" in reasons
        hub.send(conn, {"type": "ping", "nonce": "still-there"})
        hub.wait_for(conn, "pong", lambda m: m.nonce == "still-there")
        assert not conn.closed


def test_agent_reconnects_and_reports_its_claims(tmp_path: Path) -> None:
    with mock_agent(tmp_path) as session:
        hub, conn = session.hub, session.conn
        lease = _lease()
        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        hub.drop(conn)
        again = hub.wait_for_connection(count=2, timeout_s=60)
        register = hub.wait_for(again, "register")
        assert [c.lease_id for c in register.claims] == [lease]


def test_claims_the_hub_does_not_want_are_released_on_welcome(tmp_path: Path) -> None:
    with mock_agent(tmp_path) as session:
        hub, conn = session.hub, session.conn
        assert hub.command(conn, "reserve", _lease(), 1, gpus="0").ok
        hub.desired_claims = []
        hub.drop(conn)
        again = hub.wait_for_connection(count=2, timeout_s=60)
        assert len(hub.wait_for(again, "register").claims) == 1
        hub.wait_for(again, "heartbeat", lambda m: m.claims == ())


def test_a_volume_report_follows_every_welcome_and_answers_a_delete(tmp_path: Path) -> None:
    name = "vol-" + "5" * 40
    with mock_agent(tmp_path) as session:
        hub, conn = session.hub, session.conn
        hub.wait_for(conn, "volume_report")
        hub.send(conn, {"type": "volume_delete", "name": name})
        report = hub.wait_for(conn, "volume_report", lambda m: bool(m.removed))
        assert [(r.name, r.reason) for r in report.removed] == [(name, "deleted")]
        hub.drop(conn)
        again = hub.wait_for_connection(count=2, timeout_s=60)
        # Repeated after a reconnect: the first answer may have been lost with the connection.
        hub.wait_for(again, "volume_report", lambda m: name in {r.name for r in m.removed})
