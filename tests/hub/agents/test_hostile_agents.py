"""A Hypothesis state machine playing a hostile agent on the real consumer: heartbeats with
values at and past the storage bounds (64-bit integers, NUL, lone surrogates, lengths), and
garbage in between. Every frame the hub accepts must survive the whole way — Redis, the flush,
Postgres — and read back the same; every frame it refuses must be one the bounds forbid; the
socket stays up throughout.

The flood, takeover and closed-socket cases are in test_agent_socket.py and
tests/e2e/test_agent_socket_faults.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest
from channels.testing import WebsocketCommunicator
from django.test import override_settings
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from hub.agents import stats
from hub.asgi import application
from hub.suppliers import liveness, services
from hub.suppliers.models import Gpu
from tests.hub import factories as f

pytestmark = pytest.mark.django_db(transaction=True)

T = TypeVar("T")
INT64_MAX = 2**63 - 1

# Each heartbeat is a storable GPU state with at most one field pushed to or past its bound, so
# every bound is tried on its own (a frame broken in several places says little).
edge_ints = st.sampled_from([-1, 0, 1, 100, 101, 2**31, INT64_MAX - 1, INT64_MAX, 2**63, 2**64])
edge_texts = st.sampled_from(
    ["", "H100", "a\x00b", "\ud800", "x\udfff", "é🙂", "\\u0000", "a" * 256, "a" * 257]
)
good_texts = st.text(min_size=1, max_size=40).filter(
    lambda t: "\x00" not in t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t)
)
good_process = st.fixed_dictionaries(
    {
        "pid": st.integers(0, 2**22),
        "name": good_texts,
        "memory_bytes": st.integers(0, INT64_MAX),
    }
)
good_gpus = st.fixed_dictionaries(
    {
        "name": good_texts,
        "memory_total_bytes": st.integers(0, INT64_MAX),
        "memory_used_bytes": st.integers(0, INT64_MAX),
        "utilization_pct": st.integers(0, 100),
        "processes": st.lists(good_process, max_size=2),
    }
)
FIELDS = ["name", "memory_total_bytes", "memory_used_bytes", "utilization_pct"]
PROCESS_FIELDS = ["pid", "name", "memory_bytes"]


@st.composite
def hostile_gpus(draw: st.DrawFn) -> dict[str, Any]:
    gpu = draw(good_gpus)
    target = draw(st.sampled_from([None, *FIELDS, "process"]))
    if target == "name":
        gpu["name"] = draw(edge_texts)
    elif target in FIELDS:
        gpu[target] = draw(edge_ints)
    elif target == "process":
        field = draw(st.sampled_from(PROCESS_FIELDS))
        process = draw(good_process)
        process[field] = draw(edge_texts if field == "name" else edge_ints)
        gpu["processes"] = [*gpu["processes"], process]
    return gpu


def _fits_text(value: str, max_len: int, *, allow_empty: bool) -> bool:
    surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in value)
    return (
        (allow_empty or bool(value))
        and len(value) <= max_len
        and "\x00" not in value
        and (not surrogate)
    )


def _fits_int(value: int, lo: int = 0, hi: int = INT64_MAX) -> bool:
    return lo <= value <= hi


def storable(gpu: dict[str, Any]) -> bool:
    """The storage bounds, written out again independently of the protocol's validators."""
    return (
        _fits_text(gpu["name"], 256, allow_empty=False)
        and _fits_int(gpu["memory_total_bytes"])
        and _fits_int(gpu["memory_used_bytes"])
        and _fits_int(gpu["utilization_pct"], 0, 100)
        and all(
            _fits_int(p["pid"])
            and _fits_int(p["memory_bytes"])
            and _fits_text(p["name"], 256, allow_empty=True)
            for p in gpu["processes"]
        )
    )


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One event loop in a thread for the consumer and the communicator, across the rules."""
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(timeout=10)
    running.close()


def test_a_hostile_agents_heartbeats_are_stored_exactly_or_refused(
    loop: asyncio.AbstractEventLoop,
) -> None:
    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    class HostileAgent(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            _, plaintext = services.create_agent_token(f.make_user("hostile"), "fuzz")
            self.agent_id = str(uuid.uuid4())
            self.socket = WebsocketCommunicator(
                application,
                "/api/p2p/ws/",
                headers=[(b"authorization", f"Bearer {plaintext}".encode())],
            )
            assert run(self.socket.connect())[0]
            register = f.register_message(self.agent_id).to_dict()
            run(self.socket.send_to(text_data=json.dumps(register)))
            welcome = json.loads(run(self.socket.receive_from(timeout=10)))
            assert welcome["type"] == "welcome", welcome
            self.host_id = int(welcome["host_id"])

        def _exchange(self, frame: str) -> list[dict[str, Any]]:
            """Send a frame, then a probe; the replies to the frame (before the probe's)."""
            marker = f"probe-{uuid.uuid4().hex}"
            run(self.socket.send_to(text_data=frame))
            run(self.socket.send_to(text_data=json.dumps({"type": marker, "v": 1})))
            replies = []
            while True:
                reply = json.loads(run(self.socket.receive_from(timeout=10)))
                if reply.get("reason") == f"unknown message type {marker!r}":
                    return replies
                replies.append(reply)

        @rule(drawn=hostile_gpus())
        def heartbeat(self, drawn: dict[str, Any]) -> None:
            gpu = {"index": 0, "uuid": "GPU-00000000-0000-4000-8000-000000000000", **drawn}
            frame = json.dumps({"type": "heartbeat", "v": 1, "gpus": [gpu], "claims": []})
            replies = self._exchange(frame)
            accepted = not any(r["type"] == "error" for r in replies)
            assert accepted == storable(gpu), (gpu, replies)
            if not accepted:
                return
            assert stats.flush_pending() == 1  # raises if Postgres refused it
            row = Gpu.objects.get(host_id=self.host_id, index=0)
            assert (row.memory_total_bytes, row.memory_used_bytes, row.utilization_pct) == (
                gpu["memory_total_bytes"],
                gpu["memory_used_bytes"],
                gpu["utilization_pct"],
            )
            assert row.processes == gpu["processes"]

        @rule(frame=st.one_of(st.text(min_size=1, max_size=50), st.binary(min_size=1).map(repr)))
        def garbage(self, frame: str) -> None:
            replies = self._exchange(frame)
            assert all(r["type"] == "error" for r in replies)

        @invariant()
        def socket_is_up(self) -> None:
            assert run(self.socket.receive_nothing(timeout=0.05))

        def teardown(self) -> None:
            run(self.socket.disconnect())
            liveness.forget(self.host_id)

    with (
        f.private_liveness_set(),
        f.private_pending_hash(),
        # Every heartbeat due for Postgres at once, so each accepted one is checked there.
        override_settings(AGENT_HEARTBEAT_INTERVAL_S=0, HOST_STATS_WRITE_INTERVAL_S=0),
    ):
        run_state_machine_as_test(
            HostileAgent,
            settings=settings(
                max_examples=25,
                stateful_step_count=10,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
