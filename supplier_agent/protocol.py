"""Agent <-> hub protocol, version 1: the one schema both sides validate every frame against.

JSON text frames, one message each, ``{"type": ..., "v": 1, ...}``. The hub imports this
module; it and the modules below import only the standard library and msgspec (and the agent's
own image and mount-path rules), so the agent never pulls in the hub.

``parse_message`` turns a frame into a frozen dataclass or raises ``ProtocolError`` with a
reason fit to send back in an ``error`` reply; ``encode`` turns a message into a frame;
``checked_body`` runs the receiver's checks on a message before it is sent. They are here, with
the message types each side accepts (``AGENT_TO_HUB``, ``HUB_TO_AGENT``). Import every name of
the protocol from this module: the rest of it lives in these, and is re-exported here:

- protocol_schema.py: the version, the limits (``MAX_*``), ``ProtocolError``, the validators of
  single fields (``validate_image``, ``validate_env``, ...), the ``Message`` base class and
  ``Error``, the one message both sides send.
- protocol_agent_to_hub.py: what the agent sends (``Register``, ``Heartbeat``, ``Ack``,
  ``ContainerExited``, ``LogChunk``, ``VolumeReport``, ``GpuHealthReport``, ...).
- protocol_hub_to_agent.py: what the hub sends (``Welcome``, the commands ``Reserve``,
  ``DockerRun`` and ``Release``, ``Logs``, ``VolumeDelete``, ``Ping``).
- protocol_terminals.py: the ``exec_*`` messages of a renter's terminal, both directions.
- protocol_upgrades.py: a staged rollout's ``upgrade`` and ``rollback`` and the agent's
  ``upgrade_status``.
- protocol_fast_path.py: msgspec's decoder for heartbeats, tried before the validators.

The schema is the hand-written validators (each message's ``from_dict``). Heartbeats, the hub's
hot path, are decoded first by msgspec Structs with the same bounds (the fast path), 3.2x
faster (12,090 against 3,761 frames/s for an 8-GPU heartbeat, docs/benchmarks.md); whatever
they refuse is decided by the validators, so every reason is theirs. Next step: the message
types themselves as Structs (18,355 frames/s, and encode 75x faster), with the validators'
reasons kept for what msgspec refuses.
"""

from __future__ import annotations

import json
from typing import Any

from supplier_agent.protocol_agent_to_hub import (
    MAX_XID,
    MAX_XIDS_REPORTED,
    Ack,
    ClaimState,
    ContainerExited,
    GpuHealth,
    GpuHealthReport,
    GpuProcess,
    GpuState,
    Heartbeat,
    LeaseNotice,
    LogChunk,
    Pong,
    Register,
    TunnelState,
    VolumeRemoval,
    VolumeReport,
    VolumeUsage,
)
from supplier_agent.protocol_fast_path import _fast_heartbeat
from supplier_agent.protocol_hub_to_agent import (
    CacheVolume,
    Command,
    DockerRun,
    Logs,
    Ping,
    Release,
    RenterVolume,
    Reserve,
    TunnelForward,
    TunnelSpec,
    VolumeDelete,
    Welcome,
    validate_public_key,
    validate_volumes,
)
from supplier_agent.protocol_schema import (
    _REGISTRY,
    CACHE_VOLUME_PREFIX,
    CLOSE_UNSUPPORTED_PROTOCOL,
    FORBIDDEN_ENV_NAMES,
    FORBIDDEN_ENV_PREFIXES,
    INT64_MAX,
    INT64_MIN,
    LOG_FOLLOW_TTL_S,
    MAX_DISK_ALLOWANCE_BYTES,
    MAX_ENV_VARS,
    MAX_FRAME_BYTES,
    MAX_GPUS_PER_LEASE,
    MAX_LOG_CHUNK_BYTES,
    MAX_LOG_SEQ,
    MAX_LOG_TAIL_LINES,
    MAX_NOTICE_CHARS,
    MAX_PIDS,
    MAX_PORTS,
    MAX_RENTER_VOLUMES,
    MAX_STR,
    MAX_UNIX_TIME,
    MAX_VOLUME_ENTRIES,
    MAX_VOLUME_SIZE_BYTES,
    RENTER_VOLUME_PREFIX,
    STOP_CAUSES,
    TUNNEL_STATES,
    VERSION,
    VOLUME_REMOVAL_REASONS,
    Error,
    Message,
    ProtocolError,
    UnsupportedVersion,
    is_volume_wire_name,
    parse_gpu_selector,
    validate_env,
    validate_image,
    validate_port,
    validate_renter_volume_name,
)
from supplier_agent.protocol_terminals import (
    MAX_EXEC_DATA_BYTES,
    MAX_TERMINAL_COLS,
    MAX_TERMINAL_ROWS,
    ExecClose,
    ExecExit,
    ExecInput,
    ExecOpen,
    ExecOutput,
    ExecResize,
)
from supplier_agent.protocol_upgrades import Rollback, Upgrade, UpgradeStatus

# Every name the protocol had when it was one module, so that `from supplier_agent.protocol
# import X` stays the one import for callers. ``_fast_heartbeat`` is imported too: it is looked
# up here at each parse, so tests can switch the fast path off by replacing it on this module.
__all__ = [
    "AGENT_TO_HUB",
    "CACHE_VOLUME_PREFIX",
    "CLOSE_UNSUPPORTED_PROTOCOL",
    "FORBIDDEN_ENV_NAMES",
    "FORBIDDEN_ENV_PREFIXES",
    "HUB_TO_AGENT",
    "INT64_MAX",
    "INT64_MIN",
    "LOG_FOLLOW_TTL_S",
    "MAX_DISK_ALLOWANCE_BYTES",
    "MAX_ENV_VARS",
    "MAX_EXEC_DATA_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_GPUS_PER_LEASE",
    "MAX_LOG_CHUNK_BYTES",
    "MAX_LOG_SEQ",
    "MAX_LOG_TAIL_LINES",
    "MAX_NOTICE_CHARS",
    "MAX_PIDS",
    "MAX_PORTS",
    "MAX_RENTER_VOLUMES",
    "MAX_STR",
    "MAX_TERMINAL_COLS",
    "MAX_TERMINAL_ROWS",
    "MAX_UNIX_TIME",
    "MAX_VOLUME_ENTRIES",
    "MAX_VOLUME_SIZE_BYTES",
    "MAX_XID",
    "MAX_XIDS_REPORTED",
    "RENTER_VOLUME_PREFIX",
    "STOP_CAUSES",
    "TUNNEL_STATES",
    "VERSION",
    "VOLUME_REMOVAL_REASONS",
    "Ack",
    "CacheVolume",
    "ClaimState",
    "Command",
    "ContainerExited",
    "DockerRun",
    "Error",
    "ExecClose",
    "ExecExit",
    "ExecInput",
    "ExecOpen",
    "ExecOutput",
    "ExecResize",
    "GpuHealth",
    "GpuHealthReport",
    "GpuProcess",
    "GpuState",
    "Heartbeat",
    "LeaseNotice",
    "LogChunk",
    "Logs",
    "Message",
    "Ping",
    "Pong",
    "ProtocolError",
    "Register",
    "Release",
    "RenterVolume",
    "Reserve",
    "Rollback",
    "TunnelForward",
    "TunnelSpec",
    "TunnelState",
    "UnsupportedVersion",
    "Upgrade",
    "UpgradeStatus",
    "VolumeDelete",
    "VolumeRemoval",
    "VolumeReport",
    "VolumeUsage",
    "Welcome",
    "checked_body",
    "encode",
    "is_volume_wire_name",
    "parse_gpu_selector",
    "parse_message",
    "validate_env",
    "validate_image",
    "validate_port",
    "validate_public_key",
    "validate_renter_volume_name",
    "validate_volumes",
]

# Which message types each side takes: the receiver passes its set to ``parse_message``.
AGENT_TO_HUB = frozenset(
    {
        "register",
        "gpu_health",
        "heartbeat",
        "ack",
        "container_exited",
        "lease_notice",
        "tunnel_state",
        "log_chunk",
        "pong",
        "volume_report",
        "exec_output",
        "exec_exit",
        "upgrade_status",
        "error",
    }
)
HUB_TO_AGENT = frozenset(
    {
        "welcome",
        "reserve",
        "docker_run",
        "release",
        "logs",
        "volume_delete",
        "exec_open",
        "exec_input",
        "exec_resize",
        "exec_close",
        "ping",
        "upgrade",
        "rollback",
        "error",
    }
)


def parse_message(frame: str | bytes, *, allowed: frozenset[str] | None = None) -> Message:
    """Validate one frame; ``allowed`` limits the types the receiving side accepts."""
    if isinstance(frame, bytes):
        raise ProtocolError("binary frames are not part of the protocol; send JSON text")
    # At most 4 bytes of UTF-8 per character: only a long frame needs measuring.
    if (
        len(frame) > MAX_FRAME_BYTES // 4
        and len(frame.encode("utf-8", errors="surrogatepass")) > MAX_FRAME_BYTES
    ):
        raise ProtocolError(f"frame larger than {MAX_FRAME_BYTES} bytes")
    if allowed is None or "heartbeat" in allowed:
        heartbeat = _fast_heartbeat(frame)
        if heartbeat is not None:
            return heartbeat
    try:
        data = json.loads(frame)
    except (ValueError, RecursionError):  # JSONDecodeError, and ints past the digit limit
        raise ProtocolError("frame is not valid JSON") from None
    if not isinstance(data, dict):
        raise ProtocolError("frame must be a JSON object")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ProtocolError("frame has no string 'type'")
    version = data.get("v")
    # type(...) is int: true and 1.0 equal 1 in Python, and are not versions.
    if type(version) is not int or version != VERSION:
        raise UnsupportedVersion(
            f"unsupported protocol version {version!r}; this side speaks v{VERSION}"
        )
    cls = _REGISTRY.get(kind)
    if cls is None or (allowed is not None and kind not in allowed):
        raise ProtocolError(f"unknown message type {kind!r}")
    return cls.from_dict(data)


def checked_body(message: Message, *, allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """The frame ``message`` encodes to, as a dict, once the receiving side's own checks have
    passed on it: the size limit and ``from_dict``, as ``parse_message`` runs them, without
    the JSON round trip. Raises ProtocolError with the receiver's reason otherwise. The hub
    builds every command through this, so both directions are checked by the one schema."""
    if allowed is not None and message.TYPE not in allowed:
        raise ProtocolError(f"unknown message type {message.TYPE!r}")
    body = message.to_dict()
    frame = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    if len(frame.encode("utf-8", errors="surrogatepass")) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame larger than {MAX_FRAME_BYTES} bytes")
    type(message).from_dict(body)
    return body


def encode(message: Message) -> str:
    # UTF-8 as is: escaping non-ASCII would triple the size of a log tail in a frame.
    return json.dumps(message.to_dict(), separators=(",", ":"), ensure_ascii=False)
