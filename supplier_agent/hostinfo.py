"""Facts about this host for ``register`` and ``doctor`` (read once; no forks)."""

from __future__ import annotations

import hashlib
import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path

MACHINE_ID_FILES = (Path("/etc/machine-id"), Path("/var/lib/dbus/machine-id"))


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    os: str
    arch: str
    cpu_model: str
    cpu_count: int
    ram_bytes: int
    machine_id: str = ""


def _os_name() -> str:
    try:
        with open("/etc/os-release") as handle:
            for line in handle:
                if line.startswith("PRETTY_NAME="):
                    return line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return f"{platform.system()} {platform.release()}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0


def machine_identity(files: tuple[Path, ...] = MACHINE_ID_FILES) -> str:
    """A stable identity of this machine for the hub (a hash: the raw machine-id is meant to
    stay on the host); empty where the OS keeps none."""
    for path in files:
        try:
            raw = path.read_text().strip()
        except OSError:
            continue
        if raw:
            return hashlib.sha256(f"cloudgpu-machine:{raw}".encode()).hexdigest()[:32]
    return ""


def read_host_info() -> HostInfo:
    return HostInfo(
        hostname=socket.gethostname()[:255] or "unknown",
        os=_os_name()[:255],
        arch=platform.machine() or "unknown",
        cpu_model=_cpu_model()[:255],
        cpu_count=os.cpu_count() or 1,
        ram_bytes=_ram_bytes(),
        machine_id=machine_identity(),
    )
