"""The heartbeat's msgspec fast path agrees with the validators: what it takes they take, with
the same result; what it refuses they decide (so every reason stays theirs)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supplier_agent import protocol
from supplier_agent.protocol import (
    AGENT_TO_HUB,
    ClaimState,
    GpuProcess,
    GpuState,
    Heartbeat,
    ProtocolError,
    encode,
    parse_message,
)

LEASE = "0f0e0d0c-0b0a-4998-8776-655443322110"
INT64_MAX = 2**63 - 1


def _by_hand(frame: str) -> tuple[str, object]:
    """The validators' verdict alone: ("ok", message) or (exception class name, reason)."""
    saved = protocol._fast_heartbeat
    protocol._fast_heartbeat = lambda frame: None  # type: ignore[assignment]
    try:
        return _verdict(frame)
    finally:
        protocol._fast_heartbeat = saved


def _verdict(frame: str) -> tuple[str, object]:
    try:
        return ("ok", parse_message(frame, allowed=AGENT_TO_HUB))
    except ProtocolError as exc:
        return (type(exc).__name__, str(exc))


def _busy() -> Heartbeat:
    return Heartbeat(
        gpus=tuple(
            GpuState(i, f"GPU-{i:08x}-0000-4000-8000-{i:012x}", "H100", 2**36, 2**35, 50,
                     (GpuProcess(100 + i, "python3", 2**30),))
            for i in range(8)
        ),
        claims=(ClaimState(LEASE, (0, 1), 7, "c" * 64, {"8888": 41000}, (100, 101)),
                ClaimState(str(uuid.uuid4()), (2,), 8)),
    )  # fmt: skip


def test_the_agents_own_heartbeats_take_the_fast_path() -> None:
    # Were the fast path to refuse them, the figures would silently be the validators' again.
    for message in (_busy(), Heartbeat()):
        assert protocol._fast_heartbeat(encode(message)) == message
        assert parse_message(encode(message), allowed=AGENT_TO_HUB) == message


@pytest.mark.parametrize(
    "claim",
    [
        {"lease_id": LEASE.upper()},  # normalised by the validators
        {"lease_id": "{" + LEASE + "}"},
        {"ports": {"08888": 41000}},  # written back as "8888"
        {"type": "heartbeat"},  # the validators let nested type/v keys through
    ],
)
def test_what_only_the_validators_take_they_still_take(claim: dict[str, Any]) -> None:
    body = {"lease_id": LEASE, "gpu_indices": [0], "epoch": 1, **claim}
    frame = json.dumps({"type": "heartbeat", "v": 1, "claims": [body]})
    assert protocol._fast_heartbeat(frame) is None
    message = parse_message(frame, allowed=AGENT_TO_HUB)
    assert message.claims[0].lease_id == LEASE  # type: ignore[attr-defined]


# --- differential: hostile heartbeats through both -------------------------------------------

edge_ints = st.one_of(
    st.sampled_from([-1, 0, 1, 63, 64, 100, 101, 65535, 65536, INT64_MAX, 2**63, 2**64]),
    st.sampled_from([True, False, 1.0, 0.5, None, "1", float("inf")]),
)
edge_texts = st.one_of(
    st.sampled_from(["", "H100", "a\x00b", "\ud800", "x\udfffy", "é🙂", "a" * 96, "a" * 97]),
    st.sampled_from(["a" * 128, "a" * 129, "a" * 256, "a" * 257, "🙂" * 256, "🙂" * 257]),
    st.sampled_from([None, 5, []]),
    st.text(max_size=8),
)
lease_ids = st.sampled_from(
    [LEASE, LEASE.upper(), LEASE.replace("-", ""), "{" + LEASE + "}", "", "x", None, 1]
)
port_keys = st.sampled_from(
    ["80", "080", "0", "65535", "65536", "99999", "+1", " 1", "\u0661", "x"]
)


_MISSING = object()


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value, or a marker that leaves the field out."""
    return st.one_of(value, st.just(_MISSING))


def _mostly(good: st.SearchStrategy[Any], edge: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # Mostly valid, so that a good share of frames is taken and the equality is tested too.
    pick = st.sampled_from(["edge", "missing", *["good"] * 14])
    return pick.flatmap(lambda kind: {"edge": edge, "missing": st.just(_MISSING)}.get(kind, good))


def _object(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    extra = st.sampled_from([{}] * 12 + [{"extra": 1}, {"type": "x"}, {"v": 1}])
    return st.builds(
        lambda values, more: {
            **{k: v for k, v in values.items() if v is not _MISSING},
            **more,
        },
        st.fixed_dictionaries(fields),
        extra,
    )


uints = st.integers(0, INT64_MAX)
processes = _object(
    pid=_mostly(st.integers(0, 2**22), edge_ints),
    name=_mostly(st.just("python3"), edge_texts),
    memory_bytes=_mostly(uints, edge_ints),
)
gpus = _object(
    index=_mostly(st.integers(0, 3), edge_ints),
    uuid=_mostly(st.just("GPU-0"), edge_texts),
    name=_mostly(st.text(min_size=1, max_size=8).filter(lambda t: "\x00" not in t), edge_texts),
    memory_total_bytes=_mostly(uints, edge_ints),
    memory_used_bytes=_mostly(uints, edge_ints),
    utilization_pct=_mostly(st.integers(0, 100), edge_ints),
    processes=_mostly(st.lists(processes, max_size=3), st.none()),
)
claims = _object(
    lease_id=_mostly(st.just(LEASE), lease_ids),
    gpu_indices=_mostly(
        st.lists(st.integers(0, 3), max_size=3), st.lists(edge_ints, min_size=1, max_size=2)
    ),
    epoch=_mostly(uints, edge_ints),
    container_id=_mostly(st.sampled_from([None, "c0ffee"]), edge_texts),
    ports=_mostly(
        st.dictionaries(st.sampled_from(["80", "8888"]), st.integers(1, 65535), max_size=2),
        st.one_of(st.dictionaries(port_keys, edge_ints, max_size=2), st.none(), st.just([])),
    ),
    pids=_mostly(st.lists(uints, max_size=3), st.lists(edge_ints, min_size=1, max_size=2)),
)
heartbeats = st.builds(
    lambda body, ascii_only: json.dumps(
        {"type": "heartbeat", "v": 1, **body}, ensure_ascii=ascii_only
    ),
    _object(gpus=st.lists(gpus, max_size=3), claims=st.lists(claims, max_size=2)),
    # Not ASCII-only: a lone surrogate reaches the parser raw in the str, not as an escape.
    st.booleans(),
)


@pytest.mark.parametrize(
    "envelope",
    [{}, {"type": "ping"}, {"type": 1}, {"v": True}, {"v": 1.0}, {"v": 2}, {"v": "1"}, {"v": None}],
)
def test_the_envelope_is_the_validators_to_refuse(envelope: dict[str, Any]) -> None:
    body = {"type": "heartbeat", "v": 1, "gpus": [], "claims": [], **envelope}
    if not envelope:
        del body["type"]  # a lone tagged Struct would take a frame without its tag
    frame = json.dumps(body)
    assert protocol._fast_heartbeat(frame) is None
    assert _verdict(frame)[0] != "ok"


@pytest.fixture(autouse=True)
def _no_leftover_patch() -> Iterator[None]:
    yield
    assert protocol._fast_heartbeat.__name__ == "_fast_heartbeat"


@settings(max_examples=300, deadline=None)
@given(frame=heartbeats)
def test_the_fast_path_never_takes_what_the_validators_refuse(frame: str) -> None:
    fast = protocol._fast_heartbeat(frame)
    by_hand = _by_hand(frame)
    if fast is not None:
        assert by_hand == ("ok", fast)
    assert _verdict(frame) == by_hand
