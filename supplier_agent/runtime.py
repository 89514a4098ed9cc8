"""What the agent asks of a runtime: the real one (NVML + flock claims + Docker) or the mock."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from supplier_agent.protocol import DockerRun, ExecOpen, GpuHealth, GpuState, VolumeReport
from supplier_agent.state import Claim
from supplier_agent.terminals import ExecProcess

# (lease_id, exit_code, log_tail) for a container that stopped on its own.
# (lease id, exit code, last log lines, OOM-killed)
ExitReport = Callable[[str, int, str, bool], None]
# (lease id, stop cause or "" for a notice, the sentence the renter reads): disk_guard.Send.
DiskSend = Callable[[str, str, str], None]


class CommandFailed(Exception):
    """A command could not be carried out; ``str()`` is the reason sent back in the ack."""


@dataclass(frozen=True)
class ReserveOutcome:
    gpu_indices: tuple[int, ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunOutcome:
    container_id: str
    ports: dict[str, int] = field(default_factory=dict)  # container port -> 127.0.0.1 port
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HostFacts:
    """What ``register`` tells renters beyond the CPU and RAM (empty or None: not measured)."""

    disk_free_bytes: int | None = None
    driver_version: str = ""
    cuda_version: str = ""


def disk_free_bytes(path: str) -> int | None:
    """Free bytes on the filesystem holding ``path`` (statvfs: no fork), or None."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


class Runtime(Protocol):
    name: str
    # Folders of this host whose paths never reach a renter (Docker's data root, wherever the
    # supplier moved it): host_paths.redact_host_paths takes them out of failure reasons.
    host_folders: tuple[str, ...]

    async def gpus(self) -> list[GpuState]: ...

    async def gpu_health(self) -> list[GpuHealth]:
        """XIDs, ECC totals, lost boards and thermal slowdown of the GPUs listed so far."""
        ...

    async def host_facts(self) -> HostFacts: ...

    async def reserve(
        self, lease_id: str, selector: tuple[int, ...] | tuple[str, ...]
    ) -> ReserveOutcome: ...

    async def start(
        self, command: DockerRun, claim: Claim, *, output: Callable[[bytes], None] | None = None
    ) -> RunOutcome:
        """Start the lease's container and warm it up; ``output`` (called from a thread), if
        given, gets the warm-up's output as it comes."""
        ...

    async def release(self, lease_id: str, claim: Claim | None) -> list[str]: ...

    async def adopt(self, claims: dict[str, Claim]) -> set[str]:
        """At start-up: keep what survives of ``claims``, clean up everything else we own.
        Returns the lease ids still held."""
        ...

    def watch_exits(self, report: ExitReport, stop: threading.Event) -> None:
        """Blocking (runs in a thread): report containers that exit on their own."""
        ...

    def watch_disk(self, send: DiskSend, stop: threading.Event) -> None:
        """Blocking (runs in a thread): measure what rentals write, warn their renters and
        stop those over their allowance or filling the host (disk_guard.py)."""
        ...

    async def prepull(self, images: Iterable[str]) -> None: ...

    async def container_pids(self, lease_ids: Iterable[str]) -> dict[str, list[int]]:
        """Host pids inside each lease's container, for the heartbeat's foreign-process check."""
        ...

    def follow_logs(
        self, lease_id: str, tail: int, sink: Callable[[bytes], None], stop: threading.Event
    ) -> None:
        """Blocking (runs in a thread): feed ``sink`` the lease's container output until the
        container exits or ``stop`` is set; ``CommandFailed`` if there is nothing to follow."""
        ...

    def open_exec(self, message: ExecOpen) -> ExecProcess:
        """Blocking (runs in a thread): a process in the lease's running container for a
        renter's terminal; ``CommandFailed`` with the reason if the lease has none here."""
        ...

    async def housekeeping(self) -> None:
        """Now and then (the agent calls it hourly): tidy what rentals leave on the host."""
        ...

    async def volume_reports(self, *, measure: bool) -> list[VolumeReport]:
        """The renters' volumes and recent removals, in frames that fit (``measure``: size them
        first, which is slow); empty when they cannot be read."""
        ...

    async def delete_volume(self, name: str) -> bool:
        """The hub's ``volume_delete``: True once removed (or unknown), False while in use."""
        ...

    async def delete_pending_volumes(self) -> bool:
        """Remove deleted volumes that have come free (after a release); whether any went."""
        ...

    async def close(self) -> None: ...
