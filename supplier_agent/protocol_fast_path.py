"""The heartbeat's fast path: msgspec decodes heartbeat frames before the validators do.

Heartbeats are the hub's hot path (one per host every 15 s, 86 % of their parse was the
validation in protocol_agent_to_hub.py). msgspec decodes and bounds-checks them in C into these
private Structs, which become the same dataclasses; anything they refuse, for whatever reason,
goes through the validators, which give the reason (or accept what these are stricter about: a
UUID not in canonical form, a leading zero in a port key). So they may refuse more, never accept
more, and tests/agent/test_protocol_fast_path.py holds them to it. ``parse_message``
(protocol.py) tries ``_fast_heartbeat`` first wherever a heartbeat is allowed.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from supplier_agent.protocol_agent_to_hub import ClaimState, GpuProcess, GpuState, Heartbeat
from supplier_agent.protocol_schema import INT64_MAX, MAX_GPUS_PER_LEASE, MAX_PIDS

_NonNegative = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
_GpuIndex = Annotated[int, msgspec.Meta(ge=0, le=MAX_GPUS_PER_LEASE - 1)]
_Port = Annotated[int, msgspec.Meta(ge=1, le=65535)]
# No NUL; lone surrogates never get this far (msgspec refuses them as malformed JSON).
_NO_NUL = "^[^\x00]*$"
_CANONICAL_UUID = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


# Written out as aliases: msgspec resolves annotations by name (this module's future import).
_Text96 = Annotated[str, msgspec.Meta(min_length=1, max_length=96, pattern=_NO_NUL)]
_Text128 = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=_NO_NUL)]
_Text256 = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=_NO_NUL)]
_Text256OrEmpty = Annotated[str, msgspec.Meta(max_length=256, pattern=_NO_NUL)]


class _FastProcess(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pid: _NonNegative
    name: _Text256OrEmpty = ""
    memory_bytes: _NonNegative = 0


class _FastGpu(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    index: _GpuIndex
    uuid: _Text96
    name: _Text256
    memory_total_bytes: _NonNegative
    memory_used_bytes: _NonNegative
    utilization_pct: Annotated[int, msgspec.Meta(ge=0, le=100)]
    processes: Annotated[tuple[_FastProcess, ...], msgspec.Meta(max_length=256)] = ()


class _FastClaim(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    lease_id: Annotated[str, msgspec.Meta(pattern=_CANONICAL_UUID)]
    gpu_indices: Annotated[tuple[_GpuIndex, ...], msgspec.Meta(max_length=MAX_GPUS_PER_LEASE)]
    epoch: _NonNegative
    container_id: _Text128 | None = None
    # Port keys as the validators write them back: digits without a leading zero.
    ports: dict[Annotated[str, msgspec.Meta(pattern="^[1-9][0-9]{0,4}$")], _Port] = {}
    pids: Annotated[tuple[_NonNegative, ...], msgspec.Meta(max_length=MAX_PIDS)] = ()


class _FastHeartbeat(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, tag="heartbeat", tag_field="type"
):
    # Literal[1]: msgspec takes neither true nor 1.0 for it.
    v: Literal[1]
    gpus: Annotated[tuple[_FastGpu, ...], msgspec.Meta(max_length=MAX_GPUS_PER_LEASE)] = ()
    claims: Annotated[tuple[_FastClaim, ...], msgspec.Meta(max_length=MAX_GPUS_PER_LEASE)] = ()


class _NotAHeartbeat(msgspec.Struct, tag="\x00"):
    """Never matches: decoding a union is what makes msgspec require the ``type`` tag (a lone
    tagged Struct takes a frame without one)."""


_FAST_HEARTBEAT: msgspec.json.Decoder[_FastHeartbeat | _NotAHeartbeat] = msgspec.json.Decoder(
    _FastHeartbeat | _NotAHeartbeat
)


def _fast_heartbeat(frame: str) -> Heartbeat | None:
    """The frame as a Heartbeat if msgspec takes it, else None (the validators decide)."""
    try:
        fast = _FAST_HEARTBEAT.decode(frame)
    except (msgspec.MsgspecError, UnicodeEncodeError):  # the latter: a str with a surrogate
        return None
    if not isinstance(fast, _FastHeartbeat):
        return None
    if len({gpu.index for gpu in fast.gpus}) != len(fast.gpus):
        return None
    claims = []
    for claim in fast.claims:
        if any(int(port) > 65535 for port in claim.ports):
            return None
        claims.append(
            ClaimState(
                claim.lease_id,
                claim.gpu_indices,
                claim.epoch,
                claim.container_id,
                claim.ports,
                claim.pids,
            )
        )
    gpus = tuple(
        GpuState(
            gpu.index,
            gpu.uuid,
            gpu.name,
            gpu.memory_total_bytes,
            gpu.memory_used_bytes,
            gpu.utilization_pct,
            tuple(GpuProcess(p.pid, p.name, p.memory_bytes) for p in gpu.processes),
        )
        for gpu in fast.gpus
    )
    return Heartbeat(gpus=gpus, claims=tuple(claims))
