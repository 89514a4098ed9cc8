"""CLOUDGPU_TRACEMALLOC_DIR: the agent traces its allocations and writes a snapshot on SIGUSR2
(supplier_agent/profiling.py), which bench/soak.py --tracemalloc diffs to find what grows."""

from __future__ import annotations

import signal
import tracemalloc
from pathlib import Path

from hub.lib.ports import free_port
from tests.support.agents import agent_env, configure, new_token, running_agent
from tests.support.polling import wait_for


def test_sigusr2_writes_a_snapshot_of_the_agents_own_allocations(tmp_path: Path) -> None:
    state = tmp_path / "agent"
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    # Nothing listens there: the agent keeps trying, which is enough to be running.
    hub = f"http://127.0.0.1:{free_port()}"
    assert configure(state, hub, new_token(), "--runtime", "mock").returncode == 0
    log = tmp_path / "agent.log"
    env = agent_env(CLOUDGPU_TRACEMALLOC_DIR=str(snapshots))
    with running_agent(state, log, env=env) as agent:
        wait_for(
            lambda: "connection to the hub lost" in log.read_text(),
            timeout_s=60,
            what="the agent running",
        )
        agent.send_signal(signal.SIGUSR2)
        dumps = wait_for(
            lambda: sorted(snapshots.glob(f"agent-{agent.pid}-*.tracemalloc")),
            timeout_s=30,
            what="a snapshot written",
        )
        assert agent.poll() is None, "SIGUSR2 must not stop the agent"
    snapshot = tracemalloc.Snapshot.load(str(dumps[0]))
    files = {stat.traceback[0].filename for stat in snapshot.statistics("filename")}
    assert any("supplier_agent" in name for name in files)


def test_without_the_setting_sigusr2_is_not_caught(tmp_path: Path) -> None:
    # Tracing is for benchmarks only: a supplier's agent neither traces nor handles SIGUSR2.
    state = tmp_path / "agent"
    hub = f"http://127.0.0.1:{free_port()}"
    assert configure(state, hub, new_token(), "--runtime", "mock").returncode == 0
    log = tmp_path / "agent.log"
    with running_agent(state, log) as agent:
        wait_for(
            lambda: "connection to the hub lost" in log.read_text(),
            timeout_s=60,
            what="the agent running",
        )
        agent.send_signal(signal.SIGUSR2)
        assert agent.wait(timeout=30) == -signal.SIGUSR2
