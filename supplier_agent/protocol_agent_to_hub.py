"""The messages the agent sends the hub (``AGENT_TO_HUB``), with the records they carry.

``register`` and ``heartbeat`` (the host, its GPUs and the claims it holds), ``ack`` of a
command, ``container_exited``, ``lease_notice``, ``log_chunk``, ``volume_report``,
``tunnel_state``, ``gpu_health`` and ``pong``. The terminal's ``exec_output`` and ``exec_exit``
are in protocol_terminals.py, ``error`` (either side's) in protocol_schema.py. Each message's
``from_dict`` is the hub's check of what an agent sent (a heartbeat's, only where the msgspec
fast path in protocol_fast_path.py refused the frame).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

from supplier_agent.protocol_schema import (
    MAX_GPUS_PER_LEASE,
    MAX_LOG_CHUNK_BYTES,
    MAX_LOG_SEQ,
    MAX_NOTICE_CHARS,
    MAX_PIDS,
    MAX_VOLUME_ENTRIES,
    STOP_CAUSES,
    TUNNEL_STATES,
    VOLUME_REMOVAL_REASONS,
    Message,
    ProtocolError,
    _expect,
    _int,
    _known,
    _list,
    _optional,
    _port_key,
    _str,
    _unix_time,
    _uuid,
    _volume_wire_name,
    validate_port,
)

_HEX = re.compile(r"^[0-9a-f]{1,64}$")


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    memory_bytes: int

    @classmethod
    def parse(cls, data: Any, where: str) -> GpuProcess:
        _expect(data, dict, where)
        _known(data, {"pid", "name", "memory_bytes"}, where)
        return cls(
            pid=_int(data.get("pid"), f"{where}.pid", lo=0),
            name=_str(data.get("name", ""), f"{where}.name", max_len=256, allow_empty=True),
            memory_bytes=_int(data.get("memory_bytes", 0), f"{where}.memory_bytes", lo=0),
        )


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_pct: int
    processes: tuple[GpuProcess, ...] = ()

    @classmethod
    def parse(cls, data: Any, where: str) -> GpuState:
        _expect(data, dict, where)
        fields = {
            "index",
            "uuid",
            "name",
            "memory_total_bytes",
            "memory_used_bytes",
            "utilization_pct",
            "processes",
        }
        _known(data, fields, where)
        procs = _list(data.get("processes", []), f"{where}.processes", max_items=256)
        return cls(
            index=_int(data.get("index"), f"{where}.index", lo=0, hi=MAX_GPUS_PER_LEASE - 1),
            uuid=_str(data.get("uuid"), f"{where}.uuid", max_len=96),
            name=_str(data.get("name"), f"{where}.name", max_len=256),
            memory_total_bytes=_int(
                data.get("memory_total_bytes"), f"{where}.memory_total_bytes", lo=0
            ),
            memory_used_bytes=_int(
                data.get("memory_used_bytes"), f"{where}.memory_used_bytes", lo=0
            ),
            utilization_pct=_int(
                data.get("utilization_pct"), f"{where}.utilization_pct", lo=0, hi=100
            ),
            processes=tuple(
                GpuProcess.parse(p, f"{where}.processes[{i}]") for i, p in enumerate(procs)
            ),
        )


@dataclass(frozen=True)
class ClaimState:
    """A claim the agent holds: the GPUs of one lease, the epoch it got them under, and the
    container running for it (if any)."""

    lease_id: str
    gpu_indices: tuple[int, ...]
    epoch: int
    container_id: str | None = None
    ports: dict[str, int] = field(default_factory=dict)
    # Host pids of the lease's container (heartbeats): any other compute process on its GPUs
    # is foreign, e.g. another platform ignoring the lock.
    pids: tuple[int, ...] = ()

    @classmethod
    def parse(cls, data: Any, where: str) -> ClaimState:
        _expect(data, dict, where)
        _known(data, {"lease_id", "gpu_indices", "epoch", "container_id", "ports", "pids"}, where)
        pids = _list(data.get("pids", []), f"{where}.pids", max_items=MAX_PIDS)
        indices = _list(
            data.get("gpu_indices"), f"{where}.gpu_indices", max_items=MAX_GPUS_PER_LEASE
        )
        ports = _expect(data.get("ports", {}), dict, f"{where}.ports")
        return cls(
            lease_id=_uuid(data.get("lease_id"), f"{where}.lease_id"),
            gpu_indices=tuple(
                _int(i, f"{where}.gpu_indices[{n}]", lo=0, hi=MAX_GPUS_PER_LEASE - 1)
                for n, i in enumerate(indices)
            ),
            epoch=_int(data.get("epoch"), f"{where}.epoch", lo=0),
            container_id=_optional(
                data.get("container_id"),
                lambda v, w: _str(v, w, max_len=128),
                f"{where}.container_id",
            ),
            # JSON keys are strings: container port -> host port on 127.0.0.1.
            ports={
                _port_key(k, f"{where}.ports"): validate_port(v, f"{where}.ports[{k}]")
                for k, v in ports.items()
            },
            pids=tuple(_int(p, f"{where}.pids[{n}]", lo=0) for n, p in enumerate(pids)),
        )


def _claims(data: dict[str, Any], where: str) -> tuple[ClaimState, ...]:
    items = _list(data.get("claims", []), f"{where}.claims", max_items=MAX_GPUS_PER_LEASE)
    return tuple(ClaimState.parse(c, f"{where}.claims[{i}]") for i, c in enumerate(items))


def _gpus(data: dict[str, Any], where: str) -> tuple[GpuState, ...]:
    items = _list(data.get("gpus", []), f"{where}.gpus", max_items=MAX_GPUS_PER_LEASE)
    gpus = tuple(GpuState.parse(g, f"{where}.gpus[{i}]") for i, g in enumerate(items))
    # One row per (host, index): two states for one GPU would fight over it in a batch write.
    if len({gpu.index for gpu in gpus}) != len(gpus):
        raise ProtocolError(f"{where}.gpus lists a GPU index twice")
    return gpus


@dataclass(frozen=True)
class Register(Message):
    TYPE: ClassVar[str] = "register"
    agent_id: str
    hostname: str
    os: str
    arch: str
    cpu_model: str
    cpu_count: int
    ram_bytes: int
    agent_version: str
    runtime: str
    gpus: tuple[GpuState, ...] = ()
    claims: tuple[ClaimState, ...] = ()
    # `smoke`: check the token and the handshake without taking over the host's connection.
    probe: bool = False
    # A hash of /etc/machine-id: which machine speaks for the agent id (empty: unknown).
    machine_id: str = ""
    # What renters choose a host by, where the agent can measure it (issue 20): free disk where
    # containers live, the NVIDIA driver and the newest CUDA it supports. Optional both ways:
    # an agent from before them sends none, and an unset one stays out of the frame.
    disk_free_bytes: int | None = None
    driver_version: str = ""
    cuda_version: str = ""

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        # Left out when unknown, so a hub from before these fields is not sent what it would
        # refuse as unknown (hubs are upgraded before the agents they serve).
        for name in ("disk_free_bytes", "driver_version", "cuda_version"):
            if body.get(name) in (None, ""):
                body.pop(name, None)
        return body

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Register:
        fields = {f.name for f in dataclasses.fields(cls)}
        _known(data, fields, "register")
        runtime = _str(data.get("runtime"), "register.runtime", max_len=16)
        if runtime not in {"docker", "mock"}:
            raise ProtocolError("register.runtime must be 'docker' or 'mock'")
        return cls(
            agent_id=_uuid(data.get("agent_id"), "register.agent_id"),
            hostname=_str(data.get("hostname"), "register.hostname", max_len=255),
            os=_str(data.get("os"), "register.os", max_len=255),
            arch=_str(data.get("arch"), "register.arch", max_len=32),
            cpu_model=_str(data.get("cpu_model", "unknown"), "register.cpu_model", max_len=255),
            cpu_count=_int(data.get("cpu_count"), "register.cpu_count", lo=1, hi=65536),
            ram_bytes=_int(data.get("ram_bytes"), "register.ram_bytes", lo=0),
            agent_version=_str(data.get("agent_version"), "register.agent_version", max_len=64),
            runtime=runtime,
            gpus=_gpus(data, "register"),
            claims=_claims(data, "register"),
            probe=_expect(data.get("probe", False), bool, "register.probe"),
            machine_id=_machine_id(data.get("machine_id", "")),
            disk_free_bytes=_optional(data.get("disk_free_bytes"), _non_negative, "register"),
            driver_version=_str(
                data.get("driver_version", ""),
                "register.driver_version",
                max_len=32,
                allow_empty=True,
            ),
            cuda_version=_str(
                data.get("cuda_version", ""), "register.cuda_version", max_len=16, allow_empty=True
            ),
        )


def _non_negative(value: Any, where: str) -> int:
    return _int(value, f"{where}.disk_free_bytes", lo=0)


def _machine_id(value: Any) -> str:
    text = _str(value, "register.machine_id", max_len=64, allow_empty=True)
    if text and not _HEX.fullmatch(text):
        raise ProtocolError("register.machine_id must be hexadecimal")
    return text


@dataclass(frozen=True)
class Heartbeat(Message):
    TYPE: ClassVar[str] = "heartbeat"
    gpus: tuple[GpuState, ...] = ()
    claims: tuple[ClaimState, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Heartbeat:
        _known(data, {"gpus", "claims"}, "heartbeat")
        return cls(gpus=_gpus(data, "heartbeat"), claims=_claims(data, "heartbeat"))


@dataclass(frozen=True)
class Ack(Message):
    TYPE: ClassVar[str] = "ack"
    command_id: str
    ok: bool
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ack:
        _known(data, {"command_id", "ok", "result", "error"}, "ack")
        return cls(
            command_id=_uuid(data.get("command_id"), "ack.command_id"),
            ok=_expect(data.get("ok"), bool, "ack.ok"),
            result=_expect(data.get("result", {}), dict, "ack.result"),
            error=_optional(data.get("error"), _str, "ack.error"),
        )


@dataclass(frozen=True)
class ContainerExited(Message):
    """A lease's container stopped on its own (a finished job, a crash)."""

    TYPE: ClassVar[str] = "container_exited"
    lease_id: str
    exit_code: int
    log_tail: str = ""
    # The kernel killed it for going over its memory limit (Docker's State.OOMKilled).
    oom_killed: bool = False
    # The agent stopped it to keep the host safe: a word from STOP_CAUSES, and the sentence
    # the renter reads. Left out of the frame when empty, for hubs from before them.
    stop_cause: str = ""
    stop_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        if not self.stop_cause:
            del body["stop_cause"], body["stop_reason"]
        return body

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ContainerExited:
        _known(
            data,
            {"lease_id", "exit_code", "log_tail", "oom_killed", "stop_cause", "stop_reason"},
            "container_exited",
        )
        oom_killed = data.get("oom_killed", False)
        _expect(oom_killed, bool, "container_exited.oom_killed")
        cause = _str(
            data.get("stop_cause", ""), "container_exited.stop_cause", max_len=32, allow_empty=True
        )
        if cause and cause not in STOP_CAUSES:
            raise ProtocolError(f"container_exited.stop_cause {cause!r} is not one of ours")
        return cls(
            stop_cause=cause,
            stop_reason=_str(
                data.get("stop_reason", ""),
                "container_exited.stop_reason",
                max_len=MAX_NOTICE_CHARS,
                allow_empty=True,
            ),
            oom_killed=oom_killed,
            lease_id=_uuid(data.get("lease_id"), "container_exited.lease_id"),
            exit_code=_int(data.get("exit_code"), "container_exited.exit_code", lo=-1, hi=65535),
            log_tail=_str(
                data.get("log_tail", ""),
                "container_exited.log_tail",
                max_len=16384,
                allow_empty=True,
            ),
        )


@dataclass(frozen=True)
class LeaseNotice(Message):
    """Something the renter of a running lease should read now (its disk nearly used up):
    the hub adds it to the lease's warnings."""

    TYPE: ClassVar[str] = "lease_notice"
    lease_id: str
    text: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LeaseNotice:
        _known(data, {"lease_id", "text"}, "lease_notice")
        return cls(
            lease_id=_uuid(data.get("lease_id"), "lease_notice.lease_id"),
            text=_str(data.get("text"), "lease_notice.text", max_len=MAX_NOTICE_CHARS),
        )


@dataclass(frozen=True)
class LogChunk(Message):
    """Output of a followed lease's container, stdout and stderr interleaved as they came.

    ``seq`` grows with every chunk of a lease (the agent starts it from the clock in
    milliseconds, so it keeps growing across an agent restart); ``data`` is UTF-8 text,
    undecodable bytes replaced, possibly with a ``[... N bytes dropped ...]`` marker where
    the agent's rate limit cut output.
    """

    TYPE: ClassVar[str] = "log_chunk"
    lease_id: str
    seq: int
    data: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LogChunk:
        _known(data, {"lease_id", "seq", "data"}, "log_chunk")
        text = _str(data.get("data"), "log_chunk.data", max_len=MAX_LOG_CHUNK_BYTES)
        if len(text.encode("utf-8", errors="surrogatepass")) > MAX_LOG_CHUNK_BYTES:
            raise ProtocolError(f"log_chunk.data is larger than {MAX_LOG_CHUNK_BYTES} bytes")
        return cls(
            lease_id=_uuid(data.get("lease_id"), "log_chunk.lease_id"),
            seq=_int(data.get("seq"), "log_chunk.seq", lo=0, hi=MAX_LOG_SEQ),
            data=text,
        )


@dataclass(frozen=True)
class VolumeUsage:
    """One volume on the host as last measured: ``bytes`` is -1 until Docker has measured it;
    ``over_cap``: it holds more than its ``size_bytes`` (leases mounting it are refused)."""

    name: str
    bytes: int
    in_use: bool
    last_used: float
    over_cap: bool = False

    @classmethod
    def parse(cls, data: Any, where: str) -> VolumeUsage:
        _expect(data, dict, where)
        _known(data, {"name", "bytes", "in_use", "last_used", "over_cap"}, where)
        return cls(
            name=_volume_wire_name(data.get("name"), f"{where}.name"),
            bytes=_int(data.get("bytes"), f"{where}.bytes", lo=-1),
            in_use=_expect(data.get("in_use"), bool, f"{where}.in_use"),
            last_used=_unix_time(data.get("last_used"), f"{where}.last_used"),
            over_cap=_expect(data.get("over_cap", False), bool, f"{where}.over_cap"),
        )


@dataclass(frozen=True)
class VolumeRemoval:
    """A volume the agent removed: ``idle`` (unused for volume_idle_days), ``disk_low`` (the
    host's disk fell under its floor) or ``deleted`` (the hub's ``volume_delete``)."""

    name: str
    reason: str
    at: float

    @classmethod
    def parse(cls, data: Any, where: str) -> VolumeRemoval:
        _expect(data, dict, where)
        _known(data, {"name", "reason", "at"}, where)
        reason = _str(data.get("reason"), f"{where}.reason", max_len=16)
        if reason not in VOLUME_REMOVAL_REASONS:
            raise ProtocolError(
                f"{where}.reason must be one of {', '.join(sorted(VOLUME_REMOVAL_REASONS))}"
            )
        return cls(
            name=_volume_wire_name(data.get("name"), f"{where}.name"),
            reason=reason,
            at=_unix_time(data.get("at"), f"{where}.at"),
        )


@dataclass(frozen=True)
class VolumeReport(Message):
    """The host's renter volumes and caches, and what it removed in the last 7 days.

    Sent after every ``welcome`` and every housekeeping sweep, and after a ``volume_delete``
    took effect. Removals repeat in every report for 7 days (the hub applies them
    idempotently: a report can be lost in a disconnect). A host with more volumes than one
    64 KiB frame holds sends several reports in a row, so a report is not the complete list:
    a volume missing from one is not gone; only ``removed`` says that.
    """

    TYPE: ClassVar[str] = "volume_report"
    volumes: tuple[VolumeUsage, ...] = ()
    removed: tuple[VolumeRemoval, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VolumeReport:
        _known(data, {"volumes", "removed"}, "volume_report")
        volumes = _list(
            data.get("volumes", []), "volume_report.volumes", max_items=MAX_VOLUME_ENTRIES
        )
        removed = _list(
            data.get("removed", []), "volume_report.removed", max_items=MAX_VOLUME_ENTRIES
        )
        report = cls(
            volumes=tuple(
                VolumeUsage.parse(v, f"volume_report.volumes[{i}]") for i, v in enumerate(volumes)
            ),
            removed=tuple(
                VolumeRemoval.parse(r, f"volume_report.removed[{i}]") for i, r in enumerate(removed)
            ),
        )
        # One row per (host, volume): two entries for one name would fight in a batch write.
        if len({v.name for v in report.volumes}) != len(report.volumes):
            raise ProtocolError("volume_report.volumes lists a volume twice")
        if len({r.name for r in report.removed}) != len(report.removed):
            raise ProtocolError("volume_report.removed lists a volume twice")
        return report


@dataclass(frozen=True)
class Pong(Message):
    TYPE: ClassVar[str] = "pong"
    nonce: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Pong:
        _known(data, {"nonce"}, "pong")
        return cls(nonce=_str(data.get("nonce"), "pong.nonce", max_len=128))


@dataclass(frozen=True)
class TunnelState(Message):
    """The agent's view of one forwarded port: ``up`` once the gateway accepted the forward."""

    TYPE: ClassVar[str] = "tunnel_state"
    lease_id: str
    port: int
    state: str
    detail: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TunnelState:
        _known(data, {"lease_id", "port", "state", "detail"}, "tunnel_state")
        state = _str(data.get("state"), "tunnel_state.state", max_len=8)
        if state not in TUNNEL_STATES:
            raise ProtocolError("tunnel_state.state must be 'up' or 'down'")
        return cls(
            lease_id=_uuid(data.get("lease_id"), "tunnel_state.lease_id"),
            port=validate_port(data.get("port"), "tunnel_state.port"),
            state=state,
            detail=_str(
                data.get("detail", ""), "tunnel_state.detail", max_len=512, allow_empty=True
            ),
        )


# The XIDs one report lists per GPU: the distinct ones since the agent started.
MAX_XIDS_REPORTED = 32
# XIDs are 32-bit codes (NVIDIA's "Xid" table numbers them from 1 to a few hundred).
MAX_XID = 2**32 - 1


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's failure signals since the agent started, as NVML reports them: XID events
    (``xids``: the distinct codes, at most MAX_XIDS_REPORTED, oldest first; ``xid_count``: all
    of them), ECC error totals since the driver loaded (volatile counters), whether NVML has
    lost the board (fallen off the bus) and whether it is slowing down for heat right now."""

    index: int
    uuid: str
    xids: tuple[int, ...] = ()
    xid_count: int = 0
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    lost: bool = False
    thermal_throttle: bool = False

    @classmethod
    def parse(cls, data: Any, where: str) -> GpuHealth:
        _expect(data, dict, where)
        fields = {
            "index",
            "uuid",
            "xids",
            "xid_count",
            "ecc_uncorrected",
            "ecc_corrected",
            "lost",
            "thermal_throttle",
        }
        _known(data, fields, where)
        xids = _list(data.get("xids", []), f"{where}.xids", max_items=MAX_XIDS_REPORTED)
        return cls(
            index=_int(data.get("index"), f"{where}.index", lo=0, hi=MAX_GPUS_PER_LEASE - 1),
            uuid=_str(data.get("uuid"), f"{where}.uuid", max_len=96),
            xids=tuple(_int(x, f"{where}.xids[{i}]", lo=0, hi=MAX_XID) for i, x in enumerate(xids)),
            xid_count=_int(data.get("xid_count", 0), f"{where}.xid_count", lo=0),
            ecc_uncorrected=_int(data.get("ecc_uncorrected", 0), f"{where}.ecc_uncorrected", lo=0),
            ecc_corrected=_int(data.get("ecc_corrected", 0), f"{where}.ecc_corrected", lo=0),
            lost=_expect(data.get("lost", False), bool, f"{where}.lost"),
            thermal_throttle=_expect(
                data.get("thermal_throttle", False), bool, f"{where}.thermal_throttle"
            ),
        )

    @property
    def healthy(self) -> bool:
        return not (self.xid_count or self.ecc_uncorrected or self.lost or self.thermal_throttle)


@dataclass(frozen=True)
class GpuHealthReport(Message):
    """The host's GPUs' health (``GpuHealth``), sent when it changes and after each register
    while any GPU is not healthy. Its own message, not heartbeat fields: a hub that predates
    it answers ``error`` and goes on, where an unknown heartbeat field would cost liveness."""

    TYPE: ClassVar[str] = "gpu_health"
    gpus: tuple[GpuHealth, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuHealthReport:
        _known(data, {"gpus"}, "gpu_health")
        items = _list(data.get("gpus", []), "gpu_health.gpus", max_items=MAX_GPUS_PER_LEASE)
        gpus = tuple(GpuHealth.parse(g, f"gpu_health.gpus[{i}]") for i, g in enumerate(items))
        if len({gpu.index for gpu in gpus}) != len(gpus):
            raise ProtocolError("gpu_health.gpus lists a GPU index twice")
        return cls(gpus=gpus)
