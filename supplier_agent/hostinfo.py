"""Facts about this host for ``register`` and ``doctor`` (read once; no forks)."""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class HostInfo:
    hostname: str
    os: str
    arch: str
    cpu_model: str
    cpu_count: int
    ram_bytes: int


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


def read_host_info() -> HostInfo:
    return HostInfo(
        hostname=socket.gethostname()[:255] or "unknown",
        os=_os_name()[:255],
        arch=platform.machine() or "unknown",
        cpu_model=_cpu_model()[:255],
        cpu_count=os.cpu_count() or 1,
        ram_bytes=_ram_bytes(),
    )
