"""`cloudgpu-agent smoke` exit codes against a real WebSocket server on loopback."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from tests.support.agents import AGENT, agent_env, configure, new_token
from tests.support.hub_peer import HubPeer


def _smoke(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, "smoke", "--state", str(state)],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=60,
        check=False,
    )


def _configured(tmp_path: Path, url: str, token: str) -> Path:
    state = tmp_path / "state"
    assert configure(state, url, token, "--runtime", "mock").returncode == 0
    return state


def test_smoke_exits_0_when_the_hub_welcomes_it(tmp_path: Path) -> None:
    token = new_token()
    with HubPeer(token) as hub:
        result = _smoke(_configured(tmp_path, hub.url, token))
        register = hub.wait_for(hub.wait_for_connection(), "register")
    assert result.returncode == 0, result.stderr
    assert "smoke: ok" in result.stdout
    assert register.runtime == "mock"
    assert len(register.gpus) == 1


def test_smoke_exits_4_when_the_token_is_rejected(tmp_path: Path) -> None:
    with HubPeer(new_token()) as hub:
        result = _smoke(_configured(tmp_path, hub.url, new_token()))
        assert hub.rejected_handshakes == 1
    assert result.returncode == 4, result.stderr
    assert "rejected the token" in result.stderr


def test_smoke_exits_3_when_the_hub_does_not_answer(tmp_path: Path) -> None:
    token = new_token()
    with HubPeer(token, behaviour="silent") as hub:
        result = _smoke(_configured(tmp_path, hub.url, token))
    assert result.returncode == 3, result.stderr
    assert "no answer" in result.stderr


def test_smoke_exits_3_when_the_handshake_never_completes(tmp_path: Path) -> None:
    # A socket that accepts TCP but never speaks HTTP: the agent must give up after 10 s.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        result = _smoke(_configured(tmp_path, f"http://127.0.0.1:{port}", new_token()))
    assert result.returncode == 3, result.stderr


def test_smoke_exits_1_when_the_hub_refuses_the_registration(tmp_path: Path) -> None:
    token = new_token()
    with HubPeer(token, behaviour="error") as hub:
        result = _smoke(_configured(tmp_path, hub.url, token))
    assert result.returncode == 1, result.stderr
    assert "host banned" in result.stderr


def test_smoke_exits_1_when_nothing_listens(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
    result = _smoke(_configured(tmp_path, f"http://127.0.0.1:{port}", new_token()))
    assert result.returncode == 1, result.stderr
    assert "refused" in result.stderr.lower()
