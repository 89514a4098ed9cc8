"""``--runtime mock``: the control-plane dry run. One fake RTX 4090, always idle; reserve, run
and release answer fake success without touching Docker or NVML; each declared port gets a small
HTTP page on a 127.0.0.1 host port instead of a container's service (``mock_pages.py``), so the
demo's tunnel URLs answer. Used by the demo and the hub's load tests, never to test the agent's
own Docker or claim code."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterable

from supplier_agent.logs import LogSink
from supplier_agent.mock_pages import MockPages
from supplier_agent.protocol import (
    DockerRun,
    ExecOpen,
    GpuHealth,
    GpuState,
    VolumeRemoval,
    VolumeReport,
)
from supplier_agent.runtime import (
    CommandFailed,
    DiskSend,
    ExitReport,
    HostFacts,
    ReserveOutcome,
    RunOutcome,
    disk_free_bytes,
)
from supplier_agent.state import Claim
from supplier_agent.terminals import ExecProcess

MOCK_GPU_NAME = "NVIDIA GeForce RTX 4090"
MOCK_GPU_MEMORY = 24 * 1024**3
MOCK_LOG_INTERVAL_S = 1.0
# The newest deletes answered in every report: what one frame holds (the real agent keeps 7 days).
MOCK_REMOVALS_KEPT = 300


class MockRuntime:
    name = "mock"
    host_folders: tuple[str, ...] = ()  # it touches no folder of the host

    def __init__(self, agent_id: str) -> None:
        self._uuid = f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'cloudgpu-mock:{agent_id}')}"
        self._held: dict[str, tuple[int, ...]] = {}
        # Volumes the hub deleted: answered as removed, so the hub's side of a delete finishes.
        self._removed: dict[str, VolumeRemoval] = {}
        self._pages = MockPages()

    async def host_facts(self) -> HostFacts:
        # No driver to ask; the disk is this machine's, measured like the real runtime's.
        return HostFacts(disk_free_bytes=disk_free_bytes("/"))

    async def gpus(self) -> list[GpuState]:
        return [
            GpuState(
                index=0,
                uuid=self._uuid,
                name=MOCK_GPU_NAME,
                memory_total_bytes=MOCK_GPU_MEMORY,
                memory_used_bytes=0,
                utilization_pct=0,
            )
        ]

    async def gpu_health(self) -> list[GpuHealth]:
        return []  # the mock GPU never fails

    async def reserve(
        self, lease_id: str, selector: tuple[int, ...] | tuple[str, ...]
    ) -> ReserveOutcome:
        if tuple(selector) not in {(0,), (self._uuid,)}:
            raise CommandFailed(f"the mock host has one GPU (index 0, {self._uuid})")
        holder = next((lease for lease, held in self._held.items() if lease != lease_id), None)
        if holder is not None:
            raise CommandFailed(f"GPU 0 is held by lease {holder}")
        self._held[lease_id] = (0,)
        return ReserveOutcome(gpu_indices=(0,), warnings=("mock runtime: nothing was claimed",))

    async def start(
        self, command: DockerRun, claim: Claim, *, output: LogSink | None = None
    ) -> RunOutcome:
        ports = await self._pages.open(command.lease_id, [str(port) for port in command.ports])
        return RunOutcome(
            container_id=f"mock-{command.lease_id}",
            ports=ports,
            extra={"service_url": f"http://mock-{command.lease_id[:8]}.invalid/"},
        )

    async def release(self, lease_id: str, claim: Claim | None) -> list[str]:
        self._held.pop(lease_id, None)
        await self._pages.close(lease_id)
        return []

    async def adopt(self, claims: dict[str, Claim]) -> set[str]:
        self._held = {lease_id: (0,) for lease_id in claims}
        # The pages went with the previous agent process; serve them again on the same ports.
        for lease_id, claim in claims.items():
            if claim.container_id and claim.ports:
                await self._pages.open(lease_id, dict(claim.ports))
        return set(claims)

    def watch_exits(self, report: ExitReport, stop: threading.Event) -> None:
        stop.wait()  # mock containers never exit on their own

    def watch_disk(self, send: DiskSend, stop: threading.Event) -> None:
        stop.wait()  # mock containers write nothing

    def open_exec(self, message: ExecOpen) -> ExecProcess:
        # No container, so no terminal; a simulated shell would be a fake a renter could mistake
        # for a real one.
        if message.lease_id not in self._held:
            raise CommandFailed(f"lease {message.lease_id} has no container on this host")
        raise CommandFailed(
            "this host runs the agent's mock runtime, which starts no containers, so there is "
            "no shell to open; a host with --runtime docker gives one"
        )

    def follow_logs(self, lease_id: str, tail: int, sink: LogSink, stop: threading.Event) -> None:
        """A few synthetic lines, so the demo and the hub's tests have output to show."""
        if lease_id not in self._held:
            raise CommandFailed(f"lease {lease_id} has no container on this host")
        sink(b"mock container: started\n")
        for tick in itertools.count(1):
            if stop.wait(MOCK_LOG_INTERVAL_S):
                return
            sink(f"mock container: tick {tick}\n".encode())

    async def prepull(self, images: Iterable[str]) -> None:
        return None

    async def container_pids(self, lease_ids: Iterable[str]) -> dict[str, list[int]]:
        return {}

    async def housekeeping(self) -> None:
        return None

    async def volume_reports(self, *, measure: bool) -> list[VolumeReport]:
        return [VolumeReport(removed=tuple(self._removed.values()))]

    async def delete_volume(self, name: str) -> bool:
        self._removed.setdefault(name, VolumeRemoval(name=name, reason="deleted", at=time.time()))
        while len(self._removed) > MOCK_REMOVALS_KEPT:
            del self._removed[next(iter(self._removed))]
        return True

    async def delete_pending_volumes(self) -> bool:
        return False

    async def close(self) -> None:
        await self._pages.close_all()
