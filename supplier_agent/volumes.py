"""Renters' volumes do not fill the supplier's disk, and the hub learns what became of them.

Two kinds of volume belong to renters: a cache per template (their models survive a redeploy,
``cloudgpu.cache``) and the volumes they made themselves (``cloudgpu.volume``, issue 13). A busy
host gathers many. A volume no container uses is removed once it has been idle
``volume_idle_days`` (14), and sooner, oldest first, while Docker's disk has less free space than
``disk_floor_gib`` (20). Docker records no "last used", so the agent keeps one in its state
folder (``cache-volumes.json``, named from when only caches had one): a volume is used while any
container mounts it and when a lease starts with it; a volume it has never seen starts its clock
when first seen.

Caps are checked on measurement, not enforced by the filesystem: Docker's local driver cannot
limit a volume's size on overlay2 or ext4. The agent measures every volume (Docker's ``df``,
after each sweep and on each connect) and a renter volume found holding more than its
``size_bytes`` is reported ``over_cap``, and leases that would mount it are refused until it is
deleted or a larger one made; between two measurements a volume can grow past its cap as far as
the disk allows. (On xfs with project quotas the local driver could enforce a ``size`` option;
the agent does not use that yet.)

Every removal (``idle``, ``disk_low``, or ``deleted`` for the hub's ``volume_delete``) is kept in
``volumes.json`` for 7 days and repeated in every ``volume_report``: a report can be lost in a
disconnect, and the hub applies them idempotently. A renter volume removed in that window is
refused to a lease rather than made again empty, so data never silently vanishes.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docker.errors import APIError, NotFound

from supplier_agent.containers import (
    LABEL_CACHE,
    LABEL_VOLUME,
    LABEL_VOLUME_CAP,
    renter_volume_name,
)
from supplier_agent.protocol import (
    RenterVolume,
    VolumeRemoval,
    VolumeReport,
    VolumeUsage,
    is_volume_wire_name,
)

log = logging.getLogger("cloudgpu.agent.volumes")

USAGE_FILE = "cache-volumes.json"
VOLUMES_FILE = "volumes.json"
DAY_S = 86400.0
GIB = 1024**3
REMOVALS_KEPT_S = 7 * DAY_S
# A usage entry encodes to at most ~160 bytes: this many stay well inside a 64 KiB frame.
REPORT_ENTRIES_PER_FRAME = 300


@dataclass(frozen=True)
class HostVolume:
    """A volume of ours in Docker: ``wire_name`` is how the hub calls it (a cache of an older
    hub may have a name the report cannot carry)."""

    docker_name: str
    wire_name: str
    renter: bool  # made by the renter (else a template cache)
    label_cap: int | None


class VolumeJanitor:
    def __init__(
        self,
        client: Any,
        state_dir: Path,
        *,
        idle_days: float = 14.0,
        disk_floor_bytes: int = 20 * GIB,
        free_bytes: Callable[[], int] | None = None,
    ) -> None:
        self.client = client
        self.path = state_dir / USAGE_FILE
        self.volumes_path = state_dir / VOLUMES_FILE
        self.idle_s = idle_days * DAY_S
        self.disk_floor_bytes = disk_floor_bytes
        self.free_bytes = free_bytes or self._docker_free_bytes
        # Lease starts (worker threads), the hourly sweep and the hub's deletes all rewrite the
        # same files: one at a time, or one's write loses the other's.
        self._lock = threading.RLock()

    # --- lease starts -------------------------------------------------------------------------

    def note_used(self, volume: str, now: float | None = None) -> None:
        with self._lock:
            usage = self._load()
            usage[volume] = time.time() if now is None else now
            self._save(usage)

    def refusal(self, volumes: Sequence[RenterVolume], now: float | None = None) -> str | None:
        """Why a lease may not mount these renter volumes (a sentence for the renter), or None."""
        now = time.time() if now is None else now
        with self._lock:
            state = self._load_state(now)
        for volume in volumes:
            if volume.name in state["deleting"]:
                return f"volume {volume.name} is being deleted on this host"
            removal = state["removed"].get(volume.name)
            if removal is not None:
                return f"volume {volume.name} was removed from this host ({removal['reason']})"
            measured = state["bytes"].get(renter_volume_name(volume.name), -1)
            if volume.size_bytes is not None and measured > volume.size_bytes:
                return (
                    f"volume {volume.name} holds more than its size cap of "
                    f"{_size(volume.size_bytes)}: delete files from it or create a larger volume"
                )
        return None

    def note_run(self, volumes: Sequence[RenterVolume], now: float | None = None) -> None:
        """A lease starts with these renter volumes: their idle clocks restart, and the cap the
        hub sent is the one reports compare with (a label cannot change after creation)."""
        now = time.time() if now is None else now
        with self._lock:
            usage, state = self._load(), self._load_state(now)
            for volume in volumes:
                docker_name = renter_volume_name(volume.name)
                usage[docker_name] = now
                if volume.size_bytes is None:
                    state["caps"].pop(docker_name, None)
                else:
                    state["caps"][docker_name] = volume.size_bytes
            self._save(usage)
            self._save_state(state)

    # --- removal ------------------------------------------------------------------------------

    def delete(self, name: str, now: float | None = None) -> bool:
        """The hub's ``volume_delete``: True once it is gone (or never was), False while a
        container still mounts it (it goes at the next sweep after it is free)."""
        now = time.time() if now is None else now
        with self._lock:
            state = self._load_state(now)
            if name in state["removed"] and name not in state["deleting"]:
                return True  # a repeated delete: nothing left to do
            state["deleting"] = sorted({*state["deleting"], name})
            self._save_state(state)
            return name in self._delete_pending(now)

    def delete_pending(self, now: float | None = None) -> bool:
        """Remove the deleted volumes that are free now; whether any went."""
        now = time.time() if now is None else now
        with self._lock:
            return bool(self._delete_pending(now))

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove what the hub deleted, what is idle too long, then what the disk floor needs;
        the Docker names removed."""
        now = time.time() if now is None else now
        with self._lock:
            deleted = self._delete_pending(now)
            volumes = {v.docker_name: v for v in self._volumes()}
            in_use = self._mounted()
            usage = {name: at for name, at in self._load().items() if name in volumes}
            for name in volumes:
                if name in in_use or name not in usage:
                    usage[name] = now
            idle = sorted((n for n in volumes if n not in in_use), key=lambda n: usage[n])
            removed: list[str] = []
            for name in idle:
                if now - usage[name] > self.idle_s:
                    days = (now - usage[name]) / DAY_S
                    if self._remove(volumes[name], "idle", f"unused for {days:.0f} days", now):
                        removed.append(name)
            for name in (n for n in idle if n not in removed):
                free = self.free_bytes()
                if free >= self.disk_floor_bytes:
                    break
                reason = (
                    f"Docker's disk has {free / GIB:.1f} GiB free, under the floor of "
                    f"{self.disk_floor_bytes / GIB:.0f} GiB"
                )
                if self._remove(volumes[name], "disk_low", reason, now):
                    removed.append(name)
            self._save({n: at for n, at in usage.items() if n not in removed})
            return [renter_volume_name(name) for name in deleted] + removed

    # --- reports ------------------------------------------------------------------------------

    def measure(self, now: float | None = None) -> None:
        """Record each volume's size from Docker's ``df`` (it walks every volume: slow on a big
        disk, so hourly and on connect only, never under the lock)."""
        rows = self.client.df().get("Volumes") or []
        sizes = {}
        for row in rows:
            labels = row.get("Labels") or {}
            size = (row.get("UsageData") or {}).get("Size", -1)
            if (LABEL_CACHE in labels or LABEL_VOLUME in labels) and isinstance(size, int):
                sizes[str(row["Name"])] = size if size >= 0 else -1
        with self._lock:
            state = self._load_state(time.time() if now is None else now)
            state["bytes"] = {name: size for name, size in sizes.items() if size >= 0}
            self._save_state(state)

    def reports(self, now: float | None = None) -> list[VolumeReport]:
        """What to tell the hub: every volume with its last measured size, and every removal of
        the last 7 days; split over several reports where one frame would not hold them."""
        now = time.time() if now is None else now
        with self._lock:
            volumes = self._volumes()
            in_use = self._mounted()
            usage, state = self._load(), self._load_state(now)
        usages = []
        for volume in volumes:
            if not is_volume_wire_name(volume.wire_name):
                continue
            size = state["bytes"].get(volume.docker_name, -1)
            cap = state["caps"].get(volume.docker_name, volume.label_cap)
            usages.append(
                VolumeUsage(
                    name=volume.wire_name,
                    bytes=size,
                    in_use=volume.docker_name in in_use,
                    # Mounted means used now; the file only learns that at the next sweep.
                    last_used=now
                    if volume.docker_name in in_use
                    else usage.get(volume.docker_name, now),
                    over_cap=volume.renter and cap is not None and size > cap,
                )
            )
        removals = [
            VolumeRemoval(name=name, reason=entry["reason"], at=entry["at"])
            for name, entry in sorted(state["removed"].items())
        ]
        return _split(usages, removals)

    # --- internals ----------------------------------------------------------------------------

    def _volumes(self) -> list[HostVolume]:
        found: dict[str, HostVolume] = {}
        for label in (LABEL_CACHE, LABEL_VOLUME):
            rows = self.client.api.volumes(filters={"label": label}).get("Volumes") or []
            for row in rows:
                labels = row.get("Labels") or {}
                renter = LABEL_VOLUME in labels
                cap = labels.get(LABEL_VOLUME_CAP, "")
                found[row["Name"]] = HostVolume(
                    docker_name=row["Name"],
                    wire_name=labels[LABEL_VOLUME] if renter else labels.get(LABEL_CACHE, ""),
                    renter=renter,
                    label_cap=int(cap) if cap.isascii() and cap.isdigit() else None,
                )
        return list(found.values())

    def _delete_pending(self, now: float) -> list[str]:
        state = self._load_state(now)
        if not state["deleting"]:
            return []
        in_use = self._mounted()
        done = []
        for name in state["deleting"]:
            docker_name = renter_volume_name(name)
            if docker_name in in_use:
                continue
            volume = HostVolume(docker_name, name, renter=True, label_cap=None)
            if self._remove(volume, "deleted", "the renter deleted it", now):
                done.append(name)
        if done:
            # _remove recorded each removal; reload so that this write keeps them.
            state = self._load_state(now)
            state["deleting"] = [name for name in state["deleting"] if name not in done]
            self._save_state(state)
        return done

    def _mounted(self) -> set[str]:
        names = set()
        for container in self.client.api.containers(all=True):
            for mount in container.get("Mounts") or []:
                if mount.get("Type") == "volume" and mount.get("Name"):
                    names.add(mount["Name"])
        return names

    def _remove(self, volume: HostVolume, reason: str, detail: str, now: float) -> bool:
        try:
            self.client.api.remove_volume(volume.docker_name)
        except NotFound:
            pass  # gone already (or never here): for the hub, removed all the same
        except APIError as exc:  # a container took it meanwhile (409): it stays
            log.info("volume %s not removed: %s", volume.docker_name, exc.explanation or exc)
            return False
        else:
            log.info("removed volume %s: %s", volume.docker_name, detail)
        if is_volume_wire_name(volume.wire_name):
            state = self._load_state(now)
            state["removed"][volume.wire_name] = {"reason": reason, "at": now}
            state["bytes"].pop(volume.docker_name, None)
            state["caps"].pop(volume.docker_name, None)
            self._save_state(state)
        return True

    def _docker_free_bytes(self) -> int:
        root = self.client.info().get("DockerRootDir") or "/var/lib/docker"
        stats = os.statvfs(root)
        return stats.f_bavail * stats.f_frsize

    def _load(self) -> dict[str, float]:
        data = _read_json(self.path)
        return {str(k): float(v) for k, v in data.items() if _is_number(v)}

    def _save(self, usage: dict[str, float]) -> None:
        _write_json(self.path, usage)

    def _load_state(self, now: float) -> dict[str, Any]:
        """The renter-volume state, corrupt parts dropped and removals older than 7 days gone."""
        data = _read_json(self.volumes_path)
        found = data.get("removed")
        removed: dict[Any, Any] = found if isinstance(found, dict) else {}
        return {
            "bytes": _int_map(data.get("bytes")),
            "caps": _int_map(data.get("caps")),
            "deleting": [n for n in data.get("deleting") or [] if isinstance(n, str)],
            "removed": {
                str(name): {"reason": entry["reason"], "at": float(entry["at"])}
                for name, entry in removed.items()
                if isinstance(entry, dict)
                and entry.get("reason") in {"idle", "disk_low", "deleted"}
                and _is_number(entry.get("at"))
                and now - entry["at"] <= REMOVALS_KEPT_S
            },
        }

    def _save_state(self, state: dict[str, Any]) -> None:
        _write_json(self.volumes_path, state)


def _split(usages: Sequence[VolumeUsage], removals: Iterable[VolumeRemoval]) -> list[VolumeReport]:
    entries: list[VolumeUsage | VolumeRemoval] = [*usages, *removals]
    reports = []
    for start in range(0, len(entries), REPORT_ENTRIES_PER_FRAME):
        chunk = entries[start : start + REPORT_ENTRIES_PER_FRAME]
        reports.append(
            VolumeReport(
                volumes=tuple(e for e in chunk if isinstance(e, VolumeUsage)),
                removed=tuple(e for e in chunk if isinstance(e, VolumeRemoval)),
            )
        )
    return reports or [VolumeReport()]


def _size(size_bytes: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size_bytes} bytes"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_map(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # missing or torn: start that part afresh rather than not start
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)
