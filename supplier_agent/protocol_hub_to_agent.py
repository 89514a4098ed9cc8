"""The messages the hub sends the agent (``HUB_TO_AGENT``), with the records they carry.

``welcome``; the commands, each with an id, its lease and the fencing epoch (``reserve``,
``docker_run`` with its cache, renter volumes and tunnel, ``release``); and ``logs``,
``volume_delete`` and ``ping``, which change nothing and are not acknowledged. The terminal's
``exec_*`` messages are in protocol_terminals.py, ``error`` (either side's) in
protocol_schema.py. The hub runs each command through ``checked_body`` (protocol.py) before it
queues it, so these ``from_dict``s are the agent's checks, applied at the hub as well.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, cast

from supplier_agent.mount_paths import MAX_MOUNT_PATH_BYTES, mount_path_refusal
from supplier_agent.protocol_schema import (
    MAX_DISK_ALLOWANCE_BYTES,
    MAX_GPUS_PER_LEASE,
    MAX_LOG_TAIL_LINES,
    MAX_PORTS,
    MAX_RENTER_VOLUMES,
    MAX_VOLUME_SIZE_BYTES,
    Message,
    ProtocolError,
    _expect,
    _int,
    _known,
    _list,
    _optional,
    _str,
    _str_list,
    _uuid,
    parse_gpu_selector,
    validate_env,
    validate_image,
    validate_port,
    validate_renter_volume_name,
)

_VOLUME_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}$")
_USER = re.compile(r"^[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,31}(?::[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,31})?$")
# An ssh host name or address: it reaches ssh's argv, so nothing that could read as an option.
_SSH_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.:-]{0,252}$")
_SSH_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
# One OpenSSH public key: "<type> <base64>" with an optional comment, on a single line.
_SSH_PUBLIC_KEY = re.compile(
    r"^(?:ssh-ed25519|ecdsa-sha2-nistp(?:256|384|521)|ssh-rsa) "
    r"[A-Za-z0-9+/=]{16,8192}(?: [\x20-\x7e]{0,128})?$"
)


@dataclass(frozen=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    host_id: str
    heartbeat_interval_s: int = 15
    # Lease ids whose claims the hub wants kept; any other claim the agent holds is released.
    desired_claims: tuple[str, ...] = ()
    prepull_images: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Welcome:
        _known(
            data, {"host_id", "heartbeat_interval_s", "desired_claims", "prepull_images"}, "welcome"
        )
        return cls(
            host_id=_str(data.get("host_id"), "welcome.host_id", max_len=64),
            heartbeat_interval_s=_int(
                data.get("heartbeat_interval_s", 15), "welcome.heartbeat_interval_s", lo=1, hi=3600
            ),
            desired_claims=tuple(
                _uuid(v, f"welcome.desired_claims[{i}]")
                for i, v in enumerate(
                    _list(
                        data.get("desired_claims", []),
                        "welcome.desired_claims",
                        max_items=MAX_GPUS_PER_LEASE,
                    )
                )
            ),
            prepull_images=tuple(
                validate_image(v, f"welcome.prepull_images[{i}]")
                for i, v in enumerate(
                    _list(data.get("prepull_images", []), "welcome.prepull_images", max_items=32)
                )
            ),
        )


@dataclass(frozen=True)
class Command(Message):
    """Every command: an id the agent de-duplicates on, the lease, and the fencing epoch."""

    command_id: str
    lease_id: str
    epoch: int

    @classmethod
    def _base(cls, data: dict[str, Any]) -> dict[str, Any]:
        where = cls.TYPE
        return {
            "command_id": _uuid(data.get("command_id"), f"{where}.command_id"),
            "lease_id": _uuid(data.get("lease_id"), f"{where}.lease_id"),
            "epoch": _int(data.get("epoch"), f"{where}.epoch", lo=0),
        }


@dataclass(frozen=True)
class Reserve(Command):
    TYPE: ClassVar[str] = "reserve"
    gpus: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Reserve:
        _known(data, {"command_id", "lease_id", "epoch", "gpus"}, "reserve")
        base = cls._base(data)
        gpus = data.get("gpus")
        parse_gpu_selector(gpus, "reserve.gpus")
        return cls(**base, gpus=cast(str, gpus))  # a selector is a string

    @property
    def selector(self) -> tuple[int, ...] | tuple[str, ...]:
        return parse_gpu_selector(self.gpus)


@dataclass(frozen=True)
class CacheVolume:
    name: str
    path: str

    @classmethod
    def parse(cls, data: Any, where: str) -> CacheVolume:
        _expect(data, dict, where)
        _known(data, {"name", "path"}, where)
        name = _str(data.get("name"), f"{where}.name", max_len=128)
        if not _VOLUME_NAME.fullmatch(name):
            raise ProtocolError(f"{where}.name {name!r} is not a valid volume name")
        return cls(name=name, path=_mount_path(data.get("path"), f"{where}.path"))


def _mount_path(value: Any, where: str) -> str:
    path = _str(value, where, max_len=MAX_MOUNT_PATH_BYTES)
    refusal = mount_path_refusal(path)
    if refusal is not None:
        raise ProtocolError(f"{where} {refusal}")
    return path


@dataclass(frozen=True)
class RenterVolume:
    """A volume the renter made, mounted at ``path``; ``size_bytes`` is its cap (None: none).

    The agent checks the cap when it measures the volume, not in the filesystem (volumes.py).
    """

    name: str
    path: str
    size_bytes: int | None = None

    @classmethod
    def parse(cls, data: Any, where: str) -> RenterVolume:
        _expect(data, dict, where)
        _known(data, {"name", "path", "size_bytes"}, where)
        return cls(
            name=validate_renter_volume_name(data.get("name"), f"{where}.name"),
            path=_mount_path(data.get("path"), f"{where}.path"),
            size_bytes=_optional(
                data.get("size_bytes"),
                lambda v, w: _int(v, w, lo=1, hi=MAX_VOLUME_SIZE_BYTES),
                f"{where}.size_bytes",
            ),
        )


def validate_volumes(
    value: Any, cache_volume: CacheVolume | None, where: str = "docker_run.volumes"
) -> tuple[RenterVolume, ...]:
    """``docker_run.volumes``: distinct names, and every mount path distinct (the cache's too):
    Docker refuses two mounts on one path only once the container is created."""
    items = _list(value, where, max_items=MAX_RENTER_VOLUMES)
    volumes = tuple(RenterVolume.parse(v, f"{where}[{i}]") for i, v in enumerate(items))
    if len({v.name for v in volumes}) != len(volumes):
        raise ProtocolError(f"{where} lists a volume twice")
    paths = [v.path for v in volumes]
    if cache_volume is not None:
        paths.append(cache_volume.path)
    if len({p.rstrip("/") for p in paths}) != len(paths):
        raise ProtocolError(f"{where}: two volumes (or a volume and the cache) share a path")
    return volumes


def validate_public_key(value: Any, where: str) -> str:
    key = _str(value, where, max_len=8192)
    if not _SSH_PUBLIC_KEY.fullmatch(key):
        raise ProtocolError(f"{where} is not an OpenSSH public key line")
    return key


@dataclass(frozen=True)
class TunnelForward:
    """One container port published on the gateway's loopback at ``listen_port``."""

    port: int
    listen_port: int

    @classmethod
    def parse(cls, data: Any, where: str) -> TunnelForward:
        _expect(data, dict, where)
        _known(data, {"port", "listen_port"}, where)
        return cls(
            port=validate_port(data.get("port"), f"{where}.port"),
            listen_port=validate_port(data.get("listen_port"), f"{where}.listen_port"),
        )


@dataclass(frozen=True)
class TunnelSpec:
    """Where the agent opens its ``ssh -R`` for a lease, and which gateway host keys to trust."""

    host: str
    port: int
    user: str
    host_keys: tuple[str, ...]
    forwards: tuple[TunnelForward, ...]

    @classmethod
    def parse(cls, data: Any, where: str) -> TunnelSpec:
        _expect(data, dict, where)
        _known(data, {"host", "port", "user", "host_keys", "forwards"}, where)
        host = _str(data.get("host"), f"{where}.host", max_len=253)
        if not _SSH_HOST.fullmatch(host):
            raise ProtocolError(f"{where}.host {host!r} is not a host name or address")
        user = _str(data.get("user"), f"{where}.user", max_len=32)
        if not _SSH_USER.fullmatch(user):
            raise ProtocolError(f"{where}.user {user!r} is not a valid login name")
        keys = _list(data.get("host_keys"), f"{where}.host_keys", max_items=8)
        if not keys:
            raise ProtocolError(
                f"{where}.host_keys lists no key: the gateway could not be verified"
            )
        forwards = _list(data.get("forwards"), f"{where}.forwards", max_items=MAX_PORTS)
        parsed = tuple(
            TunnelForward.parse(f, f"{where}.forwards[{i}]") for i, f in enumerate(forwards)
        )
        if len({f.port for f in parsed}) != len(parsed) or len(
            {f.listen_port for f in parsed}
        ) != len(parsed):
            raise ProtocolError(f"{where}.forwards lists a port twice")
        return cls(
            host=host,
            port=validate_port(data.get("port"), f"{where}.port"),
            user=user,
            host_keys=tuple(
                validate_public_key(k, f"{where}.host_keys[{i}]") for i, k in enumerate(keys)
            ),
            forwards=parsed,
        )


@dataclass(frozen=True)
class DockerRun(Command):
    TYPE: ClassVar[str] = "docker_run"
    image: str = ""
    ports: tuple[int, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] | None = None
    command: tuple[str, ...] | None = None
    user: str | None = None
    cache_volume: CacheVolume | None = None
    warmup: tuple[str, ...] | None = None
    # ISO 8601 UTC; past it, an agent that cannot reach the hub releases the lease itself.
    paid_until: str | None = None
    # Present when the hub runs a tunnel gateway: every forward's port is one of ``ports``.
    tunnel: TunnelSpec | None = None
    # The renter's own volumes (issue 13); left out of the frame when empty, so that agents
    # from before them still take the commands of a newer hub.
    volumes: tuple[RenterVolume, ...] = ()
    # What the lease may write on the host in all (writable layer, cache, volumes): the
    # agent stops it past this (disk_guard.py). None: the agent's own default.
    disk_allowance_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        body = super().to_dict()
        # Unset optional fields stay out of the frame, as the hub has always sent them: an agent
        # from before a field (tunnel, paid_until, volumes) refuses it as unknown even as null.
        for name in [name for name, value in body.items() if value is None]:
            del body[name]
        if not self.volumes:
            del body["volumes"]
        return body

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DockerRun:
        fields = {f.name for f in dataclasses.fields(cls)}
        _known(data, fields, "docker_run")
        ports = _list(data.get("ports", []), "docker_run.ports", max_items=MAX_PORTS)
        parsed_ports = tuple(
            validate_port(p, f"docker_run.ports[{i}]") for i, p in enumerate(ports)
        )
        if len(set(parsed_ports)) != len(parsed_ports):
            raise ProtocolError("docker_run.ports lists a port twice")
        user = _optional(data.get("user"), _str, "docker_run.user")
        if user is not None and not _USER.fullmatch(user):
            raise ProtocolError("docker_run.user must look like 'name', 'uid' or 'uid:gid'")
        cache_volume = _optional(
            data.get("cache_volume"), CacheVolume.parse, "docker_run.cache_volume"
        )
        return cls(
            **cls._base(data),
            image=validate_image(data.get("image"), "docker_run.image"),
            ports=parsed_ports,
            env=validate_env(data.get("env", {}), "docker_run.env"),
            entrypoint=_optional(data.get("entrypoint"), _str_list, "docker_run.entrypoint"),
            command=_optional(data.get("command"), _str_list, "docker_run.command"),
            user=user,
            cache_volume=cache_volume,
            warmup=_optional(data.get("warmup"), _str_list, "docker_run.warmup"),
            paid_until=_optional(
                data.get("paid_until"), lambda v, w: _str(v, w, max_len=64), "docker_run.paid_until"
            ),
            tunnel=_tunnel_for(data.get("tunnel"), parsed_ports),
            volumes=validate_volumes(data.get("volumes", []), cache_volume),
            disk_allowance_bytes=_optional(
                data.get("disk_allowance_bytes"),
                lambda v, w: _int(v, w, lo=1, hi=MAX_DISK_ALLOWANCE_BYTES),
                "docker_run.disk_allowance_bytes",
            ),
        )


def _tunnel_for(data: Any, ports: tuple[int, ...]) -> TunnelSpec | None:
    tunnel: TunnelSpec | None = _optional(data, TunnelSpec.parse, "docker_run.tunnel")
    if tunnel is not None and any(f.port not in ports for f in tunnel.forwards):
        raise ProtocolError("docker_run.tunnel forwards a port the container does not declare")
    return tunnel


@dataclass(frozen=True)
class Release(Command):
    TYPE: ClassVar[str] = "release"
    reason: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Release:
        _known(data, {"command_id", "lease_id", "epoch", "reason"}, "release")
        return cls(
            **cls._base(data),
            reason=_str(data.get("reason", ""), "release.reason", max_len=64, allow_empty=True),
        )


@dataclass(frozen=True)
class Logs(Message):
    """Follow a lease's container output (``follow``: start, or renew for LOG_FOLLOW_TTL_S),
    or stop following it. ``tail``: how many earlier lines to send first when starting.

    Not a Command: nothing changes state, so there is no command_id, epoch or ack; an agent
    that cannot follow answers with an ``error`` whose ref is ``logs``."""

    TYPE: ClassVar[str] = "logs"
    lease_id: str
    follow: bool = True
    tail: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Logs:
        _known(data, {"lease_id", "follow", "tail"}, "logs")
        return cls(
            lease_id=_uuid(data.get("lease_id"), "logs.lease_id"),
            follow=_expect(data.get("follow", True), bool, "logs.follow"),
            tail=_int(data.get("tail", 0), "logs.tail", lo=0, hi=MAX_LOG_TAIL_LINES),
        )


@dataclass(frozen=True)
class VolumeDelete(Message):
    """Remove a renter's volume (never a cache) from this host: at once if no container mounts
    it, else once none does. The agent answers with a ``volume_report`` listing it as removed
    (``deleted``), also for a name it never had, so the hub can finish either way.

    Not a Command: it names no lease and needs no epoch; repeating it is harmless."""

    TYPE: ClassVar[str] = "volume_delete"
    name: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> VolumeDelete:
        _known(data, {"name"}, "volume_delete")
        return cls(name=validate_renter_volume_name(data.get("name"), "volume_delete.name"))


@dataclass(frozen=True)
class Ping(Message):
    TYPE: ClassVar[str] = "ping"
    nonce: str

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Ping:
        _known(data, {"nonce"}, "ping")
        return cls(nonce=_str(data.get("nonce"), "ping.nonce", max_len=128))
