"""Renters' cache volumes do not fill the supplier's disk: idle ones are removed.

Each renter has a cache volume per template on a host (their models survive a redeploy), so a
busy host gathers many. A volume no container uses is removed once it has been idle
``volume_idle_days`` (14), and sooner, oldest first, while Docker's disk has less free space than
``disk_floor_gib`` (20). Docker records no "last used", so the agent keeps one in its state
folder (``cache-volumes.json``): a volume is used while any container mounts it and when a lease
starts with it; a volume it has never seen starts its clock when first seen.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supplier_agent.containers import LABEL_CACHE

log = logging.getLogger("cloudgpu.agent.volumes")

USAGE_FILE = "cache-volumes.json"
DAY_S = 86400.0
GIB = 1024**3


class CacheJanitor:
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
        self.idle_s = idle_days * DAY_S
        self.disk_floor_bytes = disk_floor_bytes
        self.free_bytes = free_bytes or self._docker_free_bytes

    def note_used(self, volume: str, now: float | None = None) -> None:
        usage = self._load()
        usage[volume] = time.time() if now is None else now
        self._save(usage)

    def sweep(self, now: float | None = None) -> list[str]:
        """Remove what is idle too long, then what the disk floor needs; the names removed."""
        now = time.time() if now is None else now
        volumes = [v.name for v in self.client.volumes.list(filters={"label": LABEL_CACHE})]
        in_use = self._mounted()
        usage = {name: at for name, at in self._load().items() if name in volumes}
        for name in volumes:
            if name in in_use or name not in usage:
                usage[name] = now
        idle = sorted((n for n in volumes if n not in in_use), key=lambda n: usage[n])
        removed = []
        for name in idle:
            if now - usage[name] > self.idle_s:
                days = (now - usage[name]) / DAY_S
                if self._remove(name, f"unused for {days:.0f} days"):
                    removed.append(name)
        for name in (n for n in idle if n not in removed):
            free = self.free_bytes()
            if free >= self.disk_floor_bytes:
                break
            reason = (
                f"Docker's disk has {free / GIB:.1f} GiB free, under the floor of "
                f"{self.disk_floor_bytes / GIB:.0f} GiB"
            )
            if self._remove(name, reason):
                removed.append(name)
        self._save({n: at for n, at in usage.items() if n not in removed})
        return removed

    def _mounted(self) -> set[str]:
        names = set()
        for container in self.client.api.containers(all=True):
            for mount in container.get("Mounts") or []:
                if mount.get("Type") == "volume" and mount.get("Name"):
                    names.add(mount["Name"])
        return names

    def _remove(self, name: str, reason: str) -> bool:
        from docker.errors import APIError, NotFound

        try:
            self.client.volumes.get(name).remove()
        except NotFound:
            return True
        except APIError as exc:  # a container took it meanwhile (409): it stays
            log.info("cache volume %s not removed: %s", name, exc.explanation or exc)
            return False
        log.info("removed cache volume %s: %s", name, reason)
        return True

    def _docker_free_bytes(self) -> int:
        root = self.client.info().get("DockerRootDir") or "/var/lib/docker"
        stats = os.statvfs(root)
        return stats.f_bavail * stats.f_frsize

    def _load(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): float(v) for k, v in data.items() if isinstance(v, int | float)}

    def _save(self, usage: dict[str, float]) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(usage, sort_keys=True))
        os.replace(tmp, self.path)
