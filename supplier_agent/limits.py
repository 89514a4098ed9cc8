"""How much of the host a lease may use: memory and CPUs in proportion to its GPUs.

Without limits one rental could take every byte and core of the host, starving the agent (which
then misses heartbeats), the supplier's own work and the other rentals. A lease with k of the
host's n GPUs gets k/n of what is left after a reserve for the host and the agent; a lease with
every GPU gets all of it but the reserve. Swap is not extended: a rental that outgrows its
memory is OOM-killed inside its own limit, and its lease ends saying so.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3
MIB = 1024**2
# Floors, so that a host with many GPUs and little RAM still starts something useful.
MIN_MEMORY_BYTES = 512 * MIB
MIN_CPUS = 0.5
# Per container: enough open files for data loaders and servers, but not "infinity" (some
# programs allocate per possible descriptor); no core dumps of renters' memory left on the
# supplier's disk.
NOFILE = 1_048_576


def nofile_limit() -> int:
    """NOFILE, or less where this host allows less: runc refuses to start a container whose
    limit is above the engine's own (seen: dockerd with a hard limit of 20,000)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)


@dataclass(frozen=True)
class HostResources:
    memory_bytes: int
    cpus: float

    @classmethod
    def read(cls) -> HostResources:
        memory = 0
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = int(line.split()[1]) * 1024
                break
        return cls(memory_bytes=memory, cpus=float(len(os.sched_getaffinity(0))))


@dataclass(frozen=True)
class Reserve:
    """What rentals never get: ``None`` fields take the defaults below."""

    memory_bytes: int | None = None
    cpus: float | None = None

    def memory_for(self, host: HostResources) -> int:
        if self.memory_bytes is not None:
            return self.memory_bytes
        return max(2 * GIB, host.memory_bytes // 10)

    def cpus_for(self, host: HostResources) -> float:
        if self.cpus is not None:
            return self.cpus
        return 1.0 if host.cpus >= 4 else 0.5


@dataclass(frozen=True)
class LeaseLimits:
    memory_bytes: int
    nano_cpus: int

    @property
    def cpus(self) -> float:
        return self.nano_cpus / 1e9


DEFAULT_RESERVE = Reserve()


def lease_limits(
    host: HostResources, claimed_gpus: int, host_gpus: int, reserve: Reserve = DEFAULT_RESERVE
) -> LeaseLimits:
    share = min(1.0, max(1, claimed_gpus) / max(1, host_gpus))
    memory = int((host.memory_bytes - reserve.memory_for(host)) * share)
    cpus = (host.cpus - reserve.cpus_for(host)) * share
    return LeaseLimits(
        memory_bytes=max(MIN_MEMORY_BYTES, memory),
        nano_cpus=int(max(MIN_CPUS, cpus) * 1e9),
    )


def parse_reserve(memory_mib: str | None, cpus: str | None) -> Reserve:
    """From the config's ``reserve_memory_mib`` / ``reserve_cpus`` (empty: the defaults)."""
    try:
        memory = int(memory_mib) * MIB if memory_mib else None
        reserved_cpus = float(cpus) if cpus else None
    except ValueError:
        raise ValueError(
            "reserve_memory_mib must be a whole number of MiB and reserve_cpus a number"
        ) from None
    if (memory is not None and memory < 0) or (reserved_cpus is not None and reserved_cpus < 0):
        raise ValueError("reserve_memory_mib and reserve_cpus cannot be negative")
    return Reserve(memory_bytes=memory, cpus=reserved_cpus)
