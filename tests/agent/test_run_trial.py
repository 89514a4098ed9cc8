"""`cloudgpu-agent run --trial SECONDS` (issue 34, item 4): the version's real `run` start-up, a
probe to the hub and SECONDS up, next to an agent that may be running on the same state folder;
exit 0, or 1 with one line saying why.

Real agent processes against a protocol peer on loopback (tests/support/hub_peer.py).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from supplier_agent import __version__
from tests.support.agents import AGENT, agent_env, configure, new_token, running_agent
from tests.support.hub_peer import HubPeer

# Real agent processes, each up for its window: seconds, out of the fast lane.
pytestmark = pytest.mark.slow


def _trial(state: Path, *extra: str, argv: list[str] | None = None) -> Any:
    return subprocess.run(
        [*(argv or [AGENT]), "run", "--trial", *extra, "--state", str(state)],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=120,
        check=False,
    )


def _configured(tmp_path: Path, url: str, token: str) -> Path:
    state = tmp_path / "state"
    assert configure(state, url, token, "--runtime", "mock").returncode == 0
    return state


def _registers(hub: HubPeer) -> list[Any]:
    return [m for c in hub.connections for m in c.received if getattr(m, "TYPE", "") == "register"]


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(path.relative_to(folder)): (path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_trial_probes_the_hub_stays_up_and_writes_nothing(tmp_path: Path) -> None:
    token = new_token()
    with HubPeer(token) as hub:
        state = _configured(tmp_path, hub.url, token)
        assert _trial(state, "0").returncode == 0  # makes the agent id, as smoke would
        # What a running agent keeps: a claim, an epoch, a journal with a line to compact away.
        (state / "claims.json").write_text("{}")
        (state / "epochs.json").write_text('{"0": 3}')
        (state / "commands.jsonl").write_text('{"command_id": "c1", "ack": {}}\ntorn line\n')
        before = _snapshot(state)

        started = time.monotonic()
        result = _trial(state, "2")
        elapsed = time.monotonic() - started

    assert result.returncode == 0, result.stderr
    assert elapsed >= 2
    assert f"cloudgpu-agent {__version__} started and stayed up 2 s" in result.stdout
    # Only probes: the hub never took either for the host's real connection.
    assert [m.probe for m in _registers(hub)] == [True, True]
    assert _snapshot(state) == before  # no lock file, no compaction, nothing


def test_a_trial_runs_next_to_the_agent_on_the_same_state_without_disturbing_it(
    tmp_path: Path,
) -> None:
    token = new_token()
    with HubPeer(token) as hub:
        state = _configured(tmp_path, hub.url, token)
        with running_agent(state, tmp_path / "agent.log") as agent:
            live = hub.wait_for_connection()
            hub.wait_for(live, "register", lambda m: not m.probe)
            result = _trial(state, "2")
            # `run` itself is refused on a folder an agent holds; the trial takes no lock.
            assert "another agent" not in result.stderr
            beats = len([m for m in live.received if getattr(m, "TYPE", "") == "heartbeat"])
            hub.wait(
                lambda: len([m for m in live.received if getattr(m, "TYPE", "") == "heartbeat"])
                > beats,
                what="a heartbeat from the running agent after the trial",
            )
            assert not live.closed
            assert agent.poll() is None

    assert result.returncode == 0, result.stderr


def test_a_trial_whose_start_up_crashes_exits_1_with_one_line_and_logs_the_traceback(
    tmp_path: Path,
) -> None:
    # `run`'s start-up path with a runtime that cannot be made: the trial must go through the
    # same make_runtime (and Agent) as `run`, so it fails the same way.
    crash = textwrap.dedent(
        """
        import sys
        import supplier_agent.mock_runtime as mock_runtime
        def broken(self, agent_id):
            raise RuntimeError("deliberately broken runtime")
        mock_runtime.MockRuntime.__init__ = broken
        from supplier_agent.cli import main
        sys.exit(main(sys.argv[1:]))
        """
    )
    token = new_token()
    with HubPeer(token) as hub:
        state = _configured(tmp_path, hub.url, token)
        result = _trial(state, "1", argv=[sys.executable, "-c", crash])
        run = subprocess.run(
            [sys.executable, "-c", crash, "run", "--state", str(state)],
            capture_output=True,
            text=True,
            env=agent_env(),
            timeout=60,
            check=False,
        )

    assert "deliberately broken runtime" in run.stderr  # `run` dies of it too
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == (
        f"cloudgpu-agent run --trial: version {__version__} did not hold up: it crashed: "
        "RuntimeError: deliberately broken runtime"
    )
    assert "Traceback" in result.stderr  # in the log, before the one line
    assert hub.connections == []


def test_a_trial_with_a_rejected_token_exits_1_with_one_line(tmp_path: Path) -> None:
    with HubPeer(new_token()) as hub:
        result = _trial(_configured(tmp_path, hub.url, new_token()), "1")

    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"cloudgpu-agent run --trial: version {__version__} did not hold up: the hub rejected "
            "the token"
        )
    )


def test_a_trial_that_is_stopped_before_its_window_exits_1(tmp_path: Path) -> None:
    token = new_token()
    with HubPeer(token) as hub:
        state = _configured(tmp_path, hub.url, token)
        process = subprocess.Popen(
            [AGENT, "run", "--trial", "60", "--state", str(state)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=agent_env(),
        )
        try:
            hub.wait(lambda: _registers(hub), what="the trial's probe")
            process.terminate()
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()

    assert process.returncode == 1
    assert stderr.strip().splitlines()[-1].endswith("stopped by a signal before its 60 s were up")


@pytest.mark.parametrize("window", ["-1", "soon", "3601"])
def test_run_trial_refuses_a_window_it_cannot_keep(tmp_path: Path, window: str) -> None:
    result = _trial(tmp_path / "state", window)
    assert result.returncode == 2
    assert "--trial" in result.stderr
