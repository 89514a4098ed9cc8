"""What every message of the agent <-> hub protocol is built from: the protocol's version and
limits, its errors, the validators of single fields, and the ``Message`` base class.

The messages themselves are in protocol_agent_to_hub.py, protocol_hub_to_agent.py and
protocol_terminals.py, and build only on this module; protocol.py (the one import for callers)
parses and encodes frames. Kept apart so that a limit or a field rule has one place, which
every message that carries such a field uses.
"""

from __future__ import annotations

import math
import re
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import msgspec

from supplier_agent.image_policy import registry_refusal

VERSION = 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")
MAX_FRAME_BYTES = 64 * 1024
MAX_GPUS_PER_LEASE = 64
MAX_PORTS = 16
MAX_ENV_VARS = 128
MAX_STR = 4096
MAX_PIDS = 1024
# Live logs: a `logs` follow lasts this long unless renewed; a `log_chunk` carries at most this
# much UTF-8 (the agent also keeps its JSON-escaped size there, so a frame stays under 64 KiB).
LOG_FOLLOW_TTL_S = 60
MAX_LOG_TAIL_LINES = 1000
MAX_LOG_CHUNK_BYTES = 16 * 1024
# JavaScript's safe integers: seq reaches the renter's page as a number.
MAX_LOG_SEQ = 2**53 - 1

# Renter env may not steer the GPU runtime or inject code into every process of the image.
FORBIDDEN_ENV_PREFIXES = ("NVIDIA_", "CUDA_VISIBLE_DEVICES")
FORBIDDEN_ENV_NAMES = frozenset({"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Docker's reference grammar, simplified: [registry[:port]/]path[:tag][@digest], lower case path.
_IMAGE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)
_GPU_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
# Wire names of volumes the hub knows: a renter's template cache (hub/leases/cache_volumes.py)
# and a volume a renter made. Only the latter may be deleted by the hub.
CACHE_VOLUME_PREFIX = "renter-"
RENTER_VOLUME_PREFIX = "vol-"
_CACHE_WIRE_NAME = re.compile(r"^renter-[0-9a-f]{40}$")
_RENTER_VOLUME_NAME = re.compile(r"^vol-[0-9a-f]{40}$")
MAX_RENTER_VOLUMES = 4
MAX_VOLUME_SIZE_BYTES = 2**62
# What one lease may write on the host: its writable layer, cache and volumes (disk_guard.py).
MAX_DISK_ALLOWANCE_BYTES = 2**62
# Why the agent itself stopped a lease's container (ContainerExited.stop_cause): over its disk
# allowance, or the biggest writer when the host's free disk fell to the supplier's floor.
STOP_CAUSES = frozenset({"disk_allowance", "disk_floor"})
MAX_NOTICE_CHARS = 500
# Per list of a volume_report; a frame still holds only what fits 64 KiB (the agent splits).
MAX_VOLUME_ENTRIES = 4096
VOLUME_REMOVAL_REASONS = frozenset({"idle", "disk_low", "deleted"})
# Unix seconds up to the year 5138: a float that any timestamp column takes.
MAX_UNIX_TIME = 1e11
TUNNEL_STATES = frozenset({"up", "down"})


class ProtocolError(ValueError):
    """A frame that is not a valid v1 message; ``str()`` is the reason for the error reply."""


class UnsupportedVersion(ProtocolError):
    """A frame of another protocol or version altogether (no ``"v": 1``): the peer is not a v1
    agent, so answering it frame by frame would go on forever."""


# The hub closes a socket that speaks another protocol with this code (cf. HTTP 426).
CLOSE_UNSUPPORTED_PROTOCOL = 4426


# --- field validators -------------------------------------------------------------------------


def _expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    # bool is an int in Python; a JSON true is never a valid number here.
    if (
        isinstance(value, bool)
        and kind is not bool
        and bool not in (kind if isinstance(kind, tuple) else (kind,))
    ):
        raise ProtocolError(f"{where} must be {_kind_name(kind)}, not a boolean")
    if not isinstance(value, kind):
        raise ProtocolError(f"{where} must be {_kind_name(kind)}, not {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "a boolean"}
    names.update({list: "a list", dict: "an object", type(None): "null"})
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _str(value: Any, where: str, *, max_len: int = MAX_STR, allow_empty: bool = False) -> str:
    _expect(value, str, where)
    if not allow_empty and not value:
        raise ProtocolError(f"{where} must not be empty")
    if len(value) > max_len:
        raise ProtocolError(f"{where} is longer than {max_len} characters")
    # What Postgres text can hold: no NUL, valid UTF-8 (JSON's \ud800 escapes decode to lone
    # surrogates, which cannot be encoded). Accepted here, such a value failed every later write.
    if "\x00" in value:
        raise ProtocolError(f"{where} contains a NUL character")
    if _SURROGATE.search(value):
        raise ProtocolError(f"{where} is not valid UTF-8 (a lone surrogate)")
    return cast(str, value)  # checked by _expect above


def _int(value: Any, where: str, *, lo: int | None = None, hi: int | None = None) -> int:
    _expect(value, int, where)
    # Every integer lands in a bigint column at most.
    if not INT64_MIN <= value <= INT64_MAX:
        raise ProtocolError(f"{where} is outside the 64-bit integer range")
    if lo is not None and value < lo:
        raise ProtocolError(f"{where} must be at least {lo}")
    if hi is not None and value > hi:
        raise ProtocolError(f"{where} must be at most {hi}")
    return cast(int, value)


def _uuid(value: Any, where: str) -> str:
    _str(value, where, max_len=64)
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ProtocolError(f"{where} must be a UUID") from None


def _list(value: Any, where: str, *, max_items: int) -> list[Any]:
    _expect(value, list, where)
    if len(value) > max_items:
        raise ProtocolError(f"{where} has more than {max_items} items")
    return cast("list[Any]", value)


def _str_list(value: Any, where: str, *, max_items: int = 256) -> tuple[str, ...]:
    items = _list(value, where, max_items=max_items)
    return tuple(_str(item, f"{where}[{i}]", allow_empty=True) for i, item in enumerate(items))


def _unix_time(value: Any, where: str) -> float:
    _expect(value, (int, float), where)
    # json.loads takes NaN and Infinity, which no timestamp column does.
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= MAX_UNIX_TIME:
        raise ProtocolError(f"{where} must be Unix seconds between 0 and {MAX_UNIX_TIME:.0f}")
    return float(value)


def _optional(value: Any, parse: Any, where: str) -> Any:
    return None if value is None else parse(value, where)


def validate_port(value: Any, where: str = "port") -> int:
    return _int(value, where, lo=1, hi=65535)


def _port_key(value: str, where: str) -> str:
    if not (value.isascii() and value.isdigit()):
        raise ProtocolError(f"{where}: key {value!r} is not a port number")
    return str(validate_port(int(value), f"{where} key"))


def validate_image(value: Any, where: str = "image") -> str:
    image = _str(value, where, max_len=512)
    if not _IMAGE.fullmatch(image):
        raise ProtocolError(
            f"{where} {image!r} is not a valid image reference (e.g. pytorch/pytorch:2.5.1)"
        )
    refusal = registry_refusal(image)
    if refusal is not None:
        raise ProtocolError(refusal)
    return image


def validate_env(value: Any, where: str = "env") -> dict[str, str]:
    _expect(value, dict, where)
    if len(value) > MAX_ENV_VARS:
        raise ProtocolError(f"{where} has more than {MAX_ENV_VARS} variables")
    env: dict[str, str] = {}
    for name, item in value.items():
        if not _ENV_NAME.fullmatch(name):
            raise ProtocolError(f"{where}: {name!r} is not a valid variable name")
        if name in FORBIDDEN_ENV_NAMES or name.startswith(FORBIDDEN_ENV_PREFIXES):
            raise ProtocolError(f"{where}: {name} may not be set by a renter")
        env[name] = _str(item, f"{where}.{name}", allow_empty=True)
    return env


def parse_gpu_selector(value: Any, where: str = "gpus") -> tuple[int, ...] | tuple[str, ...]:
    """``"0,1"`` -> indices, ``"GPU-<uuid>,..."`` -> UUIDs; both 1..64 distinct entries.

    A count is resolved by the hub before it sends ``reserve``; the agent gets explicit GPUs.
    """
    _str(value, where, max_len=64 * 41)
    parts = value.split(",")
    if not 1 <= len(parts) <= MAX_GPUS_PER_LEASE:
        raise ProtocolError(f"{where} must name 1 to {MAX_GPUS_PER_LEASE} GPUs")
    if len(set(parts)) != len(parts):
        raise ProtocolError(f"{where} names a GPU twice")
    if all(part.isdigit() and part.isascii() for part in parts):
        indices = tuple(int(part) for part in parts)
        if any(index >= MAX_GPUS_PER_LEASE for index in indices):
            raise ProtocolError(f"{where}: GPU indices go from 0 to {MAX_GPUS_PER_LEASE - 1}")
        return indices
    if all(_GPU_UUID.fullmatch(part) for part in parts):
        return tuple(parts)
    raise ProtocolError(
        f"{where} must be GPU indices like '0,1' or NVML UUIDs like 'GPU-<uuid>', not {value!r}"
    )


def validate_renter_volume_name(value: Any, where: str) -> str:
    name = _str(value, where, max_len=64)
    if not _RENTER_VOLUME_NAME.fullmatch(name):
        raise ProtocolError(f"{where} must be 'vol-' and 40 lowercase hex digits")
    return name


def _volume_wire_name(value: Any, where: str) -> str:
    name = _str(value, where, max_len=64)
    if not (_RENTER_VOLUME_NAME.fullmatch(name) or _CACHE_WIRE_NAME.fullmatch(name)):
        raise ProtocolError(
            f"{where} must be 'vol-' or 'renter-' and 40 lowercase hex digits, not {name!r}"
        )
    return name


def is_volume_wire_name(name: str) -> bool:
    """Whether ``name`` can travel in a ``volume_report`` (caches of older hubs cannot)."""
    return bool(_RENTER_VOLUME_NAME.fullmatch(name) or _CACHE_WIRE_NAME.fullmatch(name))


# --- the message base -----------------------------------------------------------------------

_REGISTRY: dict[str, type[Message]] = {}


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.TYPE:
            _REGISTRY[cls.TYPE] = cls

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:  # pragma: no cover - overridden
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        body = {"type": self.TYPE, "v": VERSION}
        # msgspec.to_builtins walks the (frozen, builtin-typed) dataclasses 3-4x faster than
        # dataclasses.asdict, which deep-copies; _plain turns the tuples it keeps into lists.
        body.update(_plain(msgspec.to_builtins(self)))
        return body


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _known(data: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = set(data) - allowed - {"type", "v"}
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")


@dataclass(frozen=True)
class Error(Message):
    """Either side's answer to a frame it could not take; the connection goes on."""

    TYPE: ClassVar[str] = "error"
    reason: str
    ref: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Error:
        _known(data, {"reason", "ref"}, "error")
        return cls(
            reason=_str(data.get("reason"), "error.reason"),
            ref=_optional(data.get("ref"), lambda v, w: _str(v, w, max_len=128), "error.ref"),
        )
