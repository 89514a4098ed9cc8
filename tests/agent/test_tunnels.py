"""Renters' tunnels against a real OpenSSH gateway: real ``ssh`` processes, a real ``sshd`` on
loopback, real HTTP through the forwards. First the supervisor on its own, then the agent."""

from __future__ import annotations

import asyncio
import gc
import http.server
import os
import signal
import threading
import uuid
import warnings
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest

from supplier_agent import tunnels as tunnels_module
from supplier_agent.protocol import TunnelSpec, TunnelState
from supplier_agent.runtime import CommandFailed
from supplier_agent.tunnels import KEY_NAME, TunnelManager
from tests.support.agents import agent_env, configure, new_token, running_agent
from tests.support.hub_peer import HubPeer, PeerConnection
from tests.support.loops import run_on_own_loop
from tests.support.polling import async_wait_for, wait_for
from tests.support.sshd import TUNNEL_USER, Sshd, free_port, generate_key, port_accepts

T = TypeVar("T")
SOME_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINkAdxiXxHqh5vLIfePFN+bB0CpdCeNqgpkfjby8qOcX"


# --- helpers ----------------------------------------------------------------------------------


class Supervisors:
    """A ``TunnelManager`` on an event loop of its own thread, so tests wait synchronously."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.reports: list[TunnelState] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.manager = TunnelManager(state_dir, self._report)

    def _report(self, message: TunnelState) -> None:
        with self._lock:
            self.reports.append(message)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=60)

    def ensure_key(self, lease: str) -> str:
        return self.call(self.manager.ensure_key(lease))

    def start(self, lease: str, spec: TunnelSpec, host_ports: dict[str, int]) -> None:
        self.call(self.manager.start(lease, spec, host_ports))

    def wait_report(
        self, match: Callable[[TunnelState], bool], *, after: int = 0, what: str = "a report"
    ) -> TunnelState:
        def found() -> TunnelState | None:
            with self._lock:
                return next((m for m in self.reports[after:] if match(m)), None)

        return wait_for(found, timeout_s=60, what=what)

    def count(self) -> int:
        with self._lock:
            return len(self.reports)

    def close(self) -> None:
        self.call(self.manager.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()


class _Marker(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = self.server.marker.encode()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def web_server(marker: str) -> Iterator[int]:
    """A local HTTP server standing in for a container's published port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Marker)
    server.marker = marker  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def tunnel_spec(
    gateway: Sshd, forwards: dict[int, int], host_keys: list[str] | None = None
) -> TunnelSpec:
    """``forwards``: container port -> gateway listen port."""
    return TunnelSpec.parse(tunnel_dict(gateway, forwards, host_keys), "tunnel")


def tunnel_dict(
    gateway: Sshd, forwards: dict[int, int], host_keys: list[str] | None = None
) -> dict[str, Any]:
    return {
        "host": "127.0.0.1",
        "port": gateway.port,
        "user": TUNNEL_USER,
        "host_keys": host_keys or [gateway.host_public_key],
        "forwards": [{"port": p, "listen_port": lp} for p, lp in forwards.items()],
    }


def ssh_processes(key: Path) -> list[psutil.Process]:
    """Live ssh processes using ``key``: the agent's tunnels, found from outside."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if str(key) in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def fetch(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/", timeout=10).text


def _is(state: str, port: int, detail: str = "") -> Callable[[TunnelState], bool]:
    return lambda m: m.state == state and m.port == port and detail in m.detail


@pytest.fixture
def gateway() -> Iterator[Sshd]:
    with Sshd() as sshd:
        yield sshd


@pytest.fixture
def supervisors(tmp_path: Path) -> Iterator[Supervisors]:
    running = Supervisors(tmp_path / "state")
    try:
        yield running
    finally:
        running.close()


# --- the supervisor ---------------------------------------------------------------------------


def test_ports_are_up_once_the_gateway_accepted_them_and_http_goes_through(
    gateway: Sshd, supervisors: Supervisors
) -> None:
    lease = str(uuid.uuid4())
    listen_a, listen_b = free_port(), free_port()
    with web_server("a") as local_a, web_server("b") as local_b:
        gateway.allow(supervisors.ensure_key(lease), listen_a, listen_b)
        spec = tunnel_spec(gateway, {8080: listen_a, 9090: listen_b})
        supervisors.start(lease, spec, {"8080": local_a, "9090": local_b})

        supervisors.wait_report(_is("up", 8080), what="port 8080 up")
        # Up means the gateway already listens: no waiting here.
        assert port_accepts(listen_a)
        assert fetch(listen_a) == "a"
        supervisors.wait_report(_is("up", 9090), what="port 9090 up")
        assert fetch(listen_b) == "b"
    key = supervisors.manager.lease_dir(lease) / KEY_NAME
    assert len(ssh_processes(key)) == 1  # one ssh carries every forward of the lease
    assert {m.state for m in supervisors.reports} == {"up"}


def test_a_forward_the_key_may_not_open_is_down_with_the_refusal_and_retried(
    gateway: Sshd, supervisors: Supervisors
) -> None:
    lease = str(uuid.uuid4())
    allowed, wanted = free_port(), free_port()
    gateway.allow(supervisors.ensure_key(lease), allowed)
    supervisors.start(lease, tunnel_spec(gateway, {8080: wanted}), {"8080": free_port()})

    down = supervisors.wait_report(_is("down", 8080), what="port 8080 down")
    assert down.detail == f"remote port forwarding failed for listen port {wanted}"
    wait_for(
        lambda: gateway.log_text().count(f"port {wanted}, but the request was denied") >= 2,
        timeout_s=60,
        what="a second attempt refused by the gateway",
    )
    assert not [m for m in supervisors.reports if m.state == "up"]
    assert not port_accepts(wanted)


def test_an_unknown_key_is_refused_and_the_tunnel_comes_up_once_it_is_known(
    gateway: Sshd, supervisors: Supervisors
) -> None:
    lease = str(uuid.uuid4())
    listen = free_port()
    public_key = supervisors.ensure_key(lease)
    with web_server("late") as local:
        supervisors.start(lease, tunnel_spec(gateway, {80: listen}), {"80": local})
        down = supervisors.wait_report(_is("down", 80), what="port 80 down")
        assert down.detail == "Permission denied (publickey)"
        assert not port_accepts(listen)

        # What happens after a docker_run: the hub records the key from the ack a moment later.
        gateway.allow(public_key, listen)
        supervisors.wait_report(_is("up", 80), what="port 80 up after a retry")
        assert fetch(listen) == "late"


def test_a_killed_ssh_is_reported_down_and_comes_back_by_itself(
    gateway: Sshd, supervisors: Supervisors
) -> None:
    lease = str(uuid.uuid4())
    listen = free_port()
    key = supervisors.manager.lease_dir(lease) / KEY_NAME
    with web_server("again") as local:
        gateway.allow(supervisors.ensure_key(lease), listen)
        supervisors.start(lease, tunnel_spec(gateway, {80: listen}), {"80": local})
        supervisors.wait_report(_is("up", 80), what="port 80 up")
        [first] = ssh_processes(key)

        mark = supervisors.count()
        first.send_signal(signal.SIGKILL)
        down = supervisors.wait_report(_is("down", 80), after=mark, what="port 80 down")
        assert down.detail == "ssh was killed by signal SIGKILL"
        supervisors.wait_report(_is("up", 80), after=mark, what="port 80 up again")
        assert fetch(listen) == "again"
        [second] = ssh_processes(key)
        assert second.pid != first.pid


def test_stop_ends_ssh_and_removes_the_key(gateway: Sshd, supervisors: Supervisors) -> None:
    lease = str(uuid.uuid4())
    listen = free_port()
    folder = supervisors.manager.lease_dir(lease)
    gateway.allow(supervisors.ensure_key(lease), listen)
    supervisors.start(lease, tunnel_spec(gateway, {80: listen}), {"80": free_port()})
    supervisors.wait_report(_is("up", 80), what="port 80 up")
    assert ssh_processes(folder / KEY_NAME)

    supervisors.call(supervisors.manager.stop(lease))
    assert ssh_processes(folder / KEY_NAME) == []
    assert not folder.exists()
    assert supervisors.manager.current_states() == []


def test_the_lease_key_is_private_and_a_restarted_supervisor_reuses_it(
    gateway: Sshd, tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    listen = free_port()
    first = Supervisors(tmp_path / "state")
    try:
        public_key = first.ensure_key(lease)
        assert public_key.endswith(f" cloudgpu-lease-{lease}")
        folder = first.manager.lease_dir(lease)
        assert folder.stat().st_mode & 0o777 == 0o700
        assert (folder / KEY_NAME).stat().st_mode & 0o777 == 0o600
        gateway.allow(public_key, listen)
        first.start(lease, tunnel_spec(gateway, {80: listen}), {"80": free_port()})
        first.wait_report(_is("up", 80), what="port 80 up")
    finally:
        first.close()  # an agent shutting down: ssh ends, the key stays
    assert ssh_processes(folder / KEY_NAME) == []
    assert (folder / KEY_NAME).exists()

    second = Supervisors(tmp_path / "state")
    try:
        assert second.ensure_key(lease) == public_key
        # The gateway knows only that key: up proves the restarted supervisor used it.
        second.start(lease, tunnel_spec(gateway, {80: listen}), {"80": free_port()})
        second.wait_report(_is("up", 80), what="port 80 up after the restart")
    finally:
        second.close()


def test_a_gateway_with_another_host_key_is_refused(
    gateway: Sshd, supervisors: Supervisors, tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    listen = free_port()
    impostor = generate_key(tmp_path / "other_host_key")
    gateway.allow(supervisors.ensure_key(lease), listen)
    spec = tunnel_spec(gateway, {80: listen}, host_keys=[impostor])
    supervisors.start(lease, spec, {"80": free_port()})

    down = supervisors.wait_report(_is("down", 80), what="port 80 down")
    assert down.detail.startswith("Host key verification failed")
    assert "Accepted publickey" not in gateway.log_text()
    assert not [m for m in supervisors.reports if m.state == "up"]


# --- the agent --------------------------------------------------------------------------------


@contextmanager
def mock_agent(
    tmp_path: Path, hub: HubPeer, env: dict[str, str] | None = None
) -> Iterator[tuple[Any, PeerConnection]]:
    state = tmp_path / "state"
    if not (state / "cloudgpu-agent.conf").exists():
        assert configure(state, hub.url, hub.token, "--runtime", "mock").returncode == 0
    count = len(hub.connections) + 1
    with running_agent(state, tmp_path / "agent.log", env=env) as process:
        conn = hub.wait_for_connection(count=count, timeout_s=60)
        hub.wait_for(conn, "register")
        yield process, conn


def test_agent_opens_the_lease_tunnel_and_closes_it_on_release(
    gateway: Sshd, tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    listen = free_port()
    folder = tmp_path / "state" / "tunnels" / lease
    with HubPeer(new_token()) as hub, mock_agent(tmp_path, hub) as (agent, conn):
        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        started = hub.command(
            conn,
            "docker_run",
            lease,
            1,
            image="busybox:latest",
            ports=[80],
            tunnel=tunnel_dict(gateway, {80: listen}),
        )
        assert started.ok, started.error
        public_key = started.result["tunnel_public_key"]
        assert public_key == (folder / f"{KEY_NAME}.pub").read_text().strip()

        gateway.allow(public_key, listen)  # the hub's part, after the ack
        up = hub.wait_for(conn, "tunnel_state", lambda m: m.state == "up", timeout_s=60)
        assert (up.lease_id, up.port) == (lease, 80)
        assert port_accepts(listen)
        [ssh] = ssh_processes(folder / KEY_NAME)
        assert ssh.ppid() == agent.pid

        assert hub.command(conn, "release", lease, 1, reason="renter_stop").ok
        assert ssh_processes(folder / KEY_NAME) == []
        assert not folder.exists()


def test_agent_resends_tunnel_states_after_a_reconnect_and_keeps_the_key_over_a_restart(
    gateway: Sshd, tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    listen = free_port()
    folder = tmp_path / "state" / "tunnels" / lease
    with HubPeer(new_token()) as hub:
        with mock_agent(tmp_path, hub) as (_, conn):
            assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
            tunnel = tunnel_dict(gateway, {80: listen})
            started = hub.command(
                conn, "docker_run", lease, 1, image="busybox:latest", ports=[80], tunnel=tunnel
            )
            assert started.ok, started.error
            gateway.allow(started.result["tunnel_public_key"], listen)
            hub.wait_for(conn, "tunnel_state", lambda m: m.state == "up", timeout_s=60)

            # The hub restarted and forgot: the agent tells the new connection again.
            hub.drop(conn)
            again = hub.wait_for_connection(count=2, timeout_s=60)
            resent = hub.wait_for(again, "tunnel_state", timeout_s=60)
            assert (resent.lease_id, resent.port, resent.state) == (lease, 80, "up")
        # The agent stopped: its ssh ended, the key the hub registered stays.
        assert ssh_processes(folder / KEY_NAME) == []
        assert (folder / KEY_NAME).exists()

        with mock_agent(tmp_path, hub) as (_, conn):
            # Only the old key is authorized: up proves the restarted agent reused it.
            hub.wait_for(conn, "tunnel_state", lambda m: m.state == "up", timeout_s=60)
            assert len(ssh_processes(folder / KEY_NAME)) == 1


def test_ssh_left_behind_by_a_killed_agent_is_replaced_on_restart(
    gateway: Sshd, tmp_path: Path
) -> None:
    lease = str(uuid.uuid4())
    listen = free_port()
    key = tmp_path / "state" / "tunnels" / lease / KEY_NAME
    with HubPeer(new_token()) as hub:
        with mock_agent(tmp_path, hub) as (agent, conn):
            assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
            tunnel = tunnel_dict(gateway, {80: listen})
            started = hub.command(
                conn, "docker_run", lease, 1, image="busybox:latest", ports=[80], tunnel=tunnel
            )
            assert started.ok, started.error
            gateway.allow(started.result["tunnel_public_key"], listen)
            hub.wait_for(conn, "tunnel_state", lambda m: m.state == "up", timeout_s=60)
            [orphan] = ssh_processes(key)
            agent.kill()  # no shutdown: the unit's KillMode=process leaves ssh running
            agent.wait(timeout=30)
        assert orphan.is_running()

        with mock_agent(tmp_path, hub) as (_, conn):
            # The old ssh still held the gateway port: up means it was ended and replaced.
            hub.wait_for(conn, "tunnel_state", lambda m: m.state == "up", timeout_s=60)
            [replacement] = ssh_processes(key)
            assert replacement.pid != orphan.pid
            assert not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE


def test_docker_run_with_a_tunnel_fails_clearly_without_ssh(tmp_path: Path) -> None:
    empty = tmp_path / "no-tools"
    empty.mkdir()
    lease = str(uuid.uuid4())
    tunnel = {
        "host": "gateway.example.com",
        "port": 22,
        "user": TUNNEL_USER,
        "host_keys": [SOME_HOST_KEY],
        "forwards": [{"port": 80, "listen_port": 20001}],
    }
    with (
        HubPeer(new_token()) as hub,
        mock_agent(tmp_path, hub, agent_env(PATH=str(empty))) as (
            _,
            conn,
        ),
    ):
        assert hub.command(conn, "reserve", lease, 1, gpus="0").ok
        started = hub.command(
            conn,
            "docker_run",
            lease,
            1,
            image="busybox:latest",
            ports=[80],
            tunnel=tunnel,
        )
        assert not started.ok
        assert started.error == (
            "this host cannot open tunnels: the OpenSSH client (ssh) is not installed; "
            "apt install openssh-client"
        )


def test_a_new_lease_takes_the_spare_key_and_a_new_spare_is_made(tmp_path: Path) -> None:
    """The reserve's key comes from a key made beforehand (a rename, not an ssh-keygen on
    the rent's path); each lease still gets a key of its own, and the spare is never a lease's."""
    manager = TunnelManager(tmp_path, lambda message: None)

    async def scenario() -> tuple[str, str, str]:
        await manager.refill_spare()
        spare = (manager.root / "spare" / "id_ed25519.pub").read_text().strip()
        first = await manager.key_for_new_lease(str(uuid.uuid4()))
        assert not (manager.root / "spare" / "id_ed25519").exists()
        await manager.refill_spare()
        second = await manager.key_for_new_lease(str(uuid.uuid4()))
        return spare, first, second

    spare, first, second = run_on_own_loop(scenario())
    assert first == spare
    assert second != first
    manager.forget_keys(keep=set())  # a restart's tidy-up keeps the spare's folder
    assert not any(p.name != "spare" for p in manager.root.iterdir())


def _hanging_keygen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``ssh-keygen`` first on PATH that notes its pid and never finishes."""
    tools = tmp_path / "bin"
    tools.mkdir()
    pid_file = tmp_path / "keygen.pid"
    keygen = tools / "ssh-keygen"
    keygen.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    keygen.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    return pid_file


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_an_agent_stopping_mid_keygen_leaves_no_tool_or_pipe_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown cancels a spare-key refill: the ssh-keygen is killed and reaped, and its pipes
    are closed before the loop goes (else an unclosed-transport warning fires later)."""
    pid_file = _hanging_keygen(tmp_path, monkeypatch)
    manager = TunnelManager(tmp_path / "tunnels", lambda message: None)

    async def scenario() -> None:
        refill = asyncio.create_task(manager.refill_spare())
        await async_wait_for(
            lambda: pid_file.exists() and pid_file.read_text().strip(),
            timeout_s=30,
            what="ssh-keygen to start",
        )
        refill.cancel()
        with pytest.raises(asyncio.CancelledError):
            await refill

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        run_on_own_loop(scenario())
        gc.collect()
    assert _gone(int(pid_file.read_text()))
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_hung_ssh_keygen_fails_clearly_and_is_killed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = _hanging_keygen(tmp_path, monkeypatch)
    monkeypatch.setattr(tunnels_module, "TOOL_TIMEOUT_S", 0.5)
    manager = TunnelManager(tmp_path / "tunnels", lambda message: None)
    with pytest.raises(CommandFailed, match="ssh-keygen did not finish"):
        run_on_own_loop(manager.refill_spare())
    assert _gone(int(pid_file.read_text()))
