"""The agent's per-lease memory goes with the lease (issue 23): an agent runs for months and
sees tens of thousands of leases. A real agent (mock runtime) in this process, so its own
tables can be counted, against the loopback protocol peer."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from supplier_agent import state as state_module
from supplier_agent.agent import Agent
from supplier_agent.config import AgentConfig
from supplier_agent.mock_runtime import MockRuntime
from supplier_agent.state import AgentState
from tests.support.agents import new_token
from tests.support.hub_peer import HubPeer, PeerConnection

LEASES = 100


@contextmanager
def _agent_in_thread(hub: HubPeer, state_dir: Path) -> Iterator[Agent]:
    config = AgentConfig(hub_url=hub.url, token=hub.token, state_dir=state_dir, runtime="mock")
    state = AgentState(state_dir)
    agent = Agent(config, MockRuntime(state.agent_id), state)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=loop.run_until_complete, args=(agent.run(stop),))
    thread.start()
    try:
        yield agent
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
    assert not thread.is_alive()


def _lease(hub: HubPeer, conn: PeerConnection, epoch: int) -> None:
    lease = str(uuid.uuid4())
    assert hub.command(conn, "reserve", lease, epoch, gpus="0").ok
    assert hub.command(conn, "docker_run", lease, epoch, image="busybox:latest", ports=[80]).ok
    assert hub.command(conn, "release", lease, epoch, reason="renter_stop").ok


def test_per_lease_locks_go_with_their_leases(tmp_path: Path) -> None:
    with HubPeer(new_token()) as hub, _agent_in_thread(hub, tmp_path / "state") as agent:
        conn = hub.wait_for_connection()
        hub.wait_for(conn, "register")
        for epoch in range(1, LEASES + 1):
            _lease(hub, conn, epoch)
            with hub._cond:
                conn.received.clear()  # the peer's own record, not the agent's

        assert len(agent._lease_locks) == 0
        assert agent.state.claims == {}


def test_remembered_answers_are_bounded_and_survive_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "MAX_REMEMBERED_COMMANDS", 50)
    state = AgentState(tmp_path)
    ids = [str(uuid.uuid4()) for _ in range(99)]
    for n, command_id in enumerate(ids):
        state.remember_answer(command_id, {"command_id": command_id, "ok": True, "n": n})

    assert len(state.answers) == 50  # in memory: never more than the bound
    assert state.answer_for(ids[0]) is None
    assert state.answer_for(ids[-1]) == {"command_id": ids[-1], "ok": True, "n": 98}

    again = AgentState(tmp_path)
    assert again.answer_for(ids[-50]) == {"command_id": ids[-50], "ok": True, "n": 49}
    assert again.answer_for(ids[-51]) is None
    assert len((tmp_path / "commands.jsonl").read_text().splitlines()) == 50
