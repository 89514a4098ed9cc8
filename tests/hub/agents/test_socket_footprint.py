"""What every agent socket keeps in the web process for hours: 10,000 of them live in one
Daphne, so a few hundred bytes each is megabytes (docs/benchmarks.md, issue 15's 10,000-agent
hold). These hold the shape that keeps it small."""

from __future__ import annotations

from typing import Any

import pytest

from hub import serve
from hub.agents import heartbeats
from hub.agents.consumer import AgentConsumer
from hub.lib.gc_schedule import FullCollections

pytestmark = pytest.mark.unit


def test_the_consumers_own_state_lives_in_slots() -> None:
    consumer = AgentConsumer()
    # Only what Channels itself sets stays in the instance dict; ours would unshare it (a
    # ~1.5 KiB dict per socket once attributes arrive in different orders).
    assert set(vars(consumer)) <= {"groups"}
    assert consumer._exec is None  # made on first use
    assert consumer._log_leases is None
    assert consumer._faults_seen == frozenset()


def test_heartbeat_state_is_slotted_and_shares_its_empty_set() -> None:
    first, second = heartbeats.Connection(), heartbeats.Connection()
    assert not hasattr(first, "__dict__")
    assert first.flagged is second.flagged  # one empty frozenset, not a set per socket


def test_websockets_are_not_wrapped_in_a_frame_of_ours(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve, "full_collections", FullCollections())
    made: list[Any] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        return None

    def application(scope: dict[str, Any], receive: Any, send: Any) -> Any:
        made.append(inner(scope, receive, send))
        return made[-1]

    wrapped = serve.ResponseSizes(application)
    socket = wrapped({"type": "websocket"}, None, None)
    assert socket is made[-1]  # the application's own coroutine, no frame around it
    socket.close()
    request = wrapped({"type": "http"}, None, None)
    assert request is not made[-1]  # HTTP responses are counted for the collection schedule
    request.close()
    made[-1].close()
