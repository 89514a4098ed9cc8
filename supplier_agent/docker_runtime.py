"""``--runtime docker``: the real thing. NVML for GPUs, flock + compute mode for claims,
the Docker SDK for containers. Blocking NVML and Docker calls run in worker threads."""

from __future__ import annotations

import asyncio
import contextlib
import grp
import logging
import os
import pwd
import stat
import threading
from collections.abc import Iterable, Iterator, Mapping

import requests
from docker.errors import DockerException, NotFound
from docker.types.daemon import CancellableStream

from supplier_agent.claims import ClaimManager, ClaimRefused
from supplier_agent.compat_docker import open_log_stream
from supplier_agent.config import AgentConfig, ConfigError
from supplier_agent.container_events import close_stream
from supplier_agent.containers import (
    LABEL_CLAIM,
    LABEL_LEASE,
    ContainerError,
    ContainerRuntime,
    cache_volume_name,
    renter_volume_name,
)
from supplier_agent.disk_guard import DiskGuard, Send, volumes_refusal
from supplier_agent.docker_exec import DockerExec, open_exec
from supplier_agent.egress import EgressPolicy
from supplier_agent.gpu import Nvml
from supplier_agent.gpu_health import HealthWatch
from supplier_agent.logs import LogSink
from supplier_agent.protocol import DockerRun, ExecOpen, GpuHealth, GpuState, VolumeReport
from supplier_agent.runtime import (
    CommandFailed,
    ExitReport,
    HostFacts,
    ReserveOutcome,
    RunOutcome,
    disk_free_bytes,
)
from supplier_agent.state import Claim
from supplier_agent.volumes import VolumeJanitor

log = logging.getLogger("cloudgpu.agent.docker")

# At most 4 bytes a character in UTF-8 (6 for an escaped control character): 24 KiB at
# worst, well inside a 64 KiB frame.
LOG_TAIL_CHARS = 4000
# Where the Docker SDK looks without DOCKER_HOST (docker.constants.DEFAULT_UNIX_SOCKET).
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"


class DockerUnavailable(ConfigError):
    """The Docker engine cannot be used from this process (no access to its socket, no daemon):
    one line with the fix, printed by the CLI like any other setting that cannot work."""


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and everything behind it: requests and urllib3 carry the OS error as a cause, a
    context, or only as an argument (``ConnectionError(ProtocolError(..., PermissionError))``)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
        todo.extend(arg for arg in current.args if isinstance(arg, BaseException))


def _docker_socket(environ: Mapping[str, str]) -> str | None:
    """The engine's unix socket as the SDK's ``from_env`` picks it; None for tcp:// or ssh://."""
    host = environ.get("DOCKER_HOST") or f"unix://{DEFAULT_DOCKER_SOCKET}"
    for scheme in ("unix://", "http+unix://"):
        if host.startswith(scheme):
            return host[len(scheme) :]
    return host if host.startswith("/") else None


def _user_name() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid with no passwd entry (a container's, say)
        return str(os.geteuid())


def docker_unavailable(
    exc: BaseException, environ: Mapping[str, str] | None = None
) -> DockerUnavailable:
    """One line for why the Docker engine could not be reached, and what to do about it.

    The SDK's own error is five chained tracebacks deep (PermissionError, urllib3, requests,
    DockerException, ours); a supplier needs the socket, whose it is and the command to run."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    socket_path = _docker_socket(env)
    where = socket_path or env.get("DOCKER_HOST", "")
    errors = list(_causes(exc))
    if socket_path and any(isinstance(e, PermissionError) for e in errors):
        user = _user_name()
        try:
            info = os.stat(socket_path)
        except OSError:
            return DockerUnavailable(
                f"cannot use Docker: this user ({user}) may not open {socket_path} or a folder "
                f"above it; run the agent as root, or give {user} access to the socket"
            )
        try:
            group = grp.getgrgid(info.st_gid).gr_name
        except KeyError:
            group = str(info.st_gid)
        # Root lacks access only without CAP_DAC_OVERRIDE (a container, a hardened unit).
        or_root = " (or run the agent as root)" if os.geteuid() != 0 else ""
        return DockerUnavailable(
            f"cannot use Docker: this user ({user}) may not open {socket_path} (mode "
            f"{stat.S_IMODE(info.st_mode):04o}, group {group}); add the user to that group with "
            f"`sudo usermod -aG {group} {user}` and log in again{or_root}"
        )
    if any(isinstance(e, (FileNotFoundError, ConnectionRefusedError)) for e in errors):
        return DockerUnavailable(
            f"cannot use Docker: nothing answers at {where}, so the Docker daemon is not "
            "running; start it (`sudo systemctl start docker`) or point DOCKER_HOST at it"
        )
    # Anything else (a tcp:// engine that times out, TLS): what the SDK said, on one line.
    reason = " ".join(str(exc).split())
    return DockerUnavailable(f"cannot use Docker at {where}: {reason}")


class DockerRuntime:
    name = "docker"

    def __init__(self, config: AgentConfig, agent_id: str) -> None:
        self.agent_id = agent_id
        # Docker first: a host whose engine this user cannot reach fails with its one line
        # (DockerUnavailable) before NVML is asked anything.
        try:
            self.containers = ContainerRuntime(
                gpu_devices=config.gpu_devices,
                reserve=config.reserve,
                egress=EgressPolicy(config.allow_networks),
                toolkit_risk_accepted=config.accept_container_escape_risk,
                log_max_bytes=int(config.container_log_mib * 1024 * 1024),
                allow_local_images=config.allow_local_images,
                default_disk_allowance=int(config.disk_allowance_gib * 1024**3),
            )
        except (ContainerError, DockerException) as exc:
            if isinstance(exc, ContainerError) and not isinstance(exc.__cause__, DockerException):
                raise
            raise docker_unavailable(exc) from None
        self.nvml = Nvml()
        self.health = HealthWatch(self.nvml)
        self.containers.host_gpus = max(1, self.nvml.gpu_count())
        self.claims = ClaimManager(
            config.lock_dir,
            self.nvml,
            config.compute_mode,
            {"agent_id": agent_id, "pid": os.getpid()},
        )
        self.janitor = VolumeJanitor(
            self.containers.client,
            config.state_dir,
            idle_days=config.volume_idle_days,
            disk_floor_bytes=int(config.disk_floor_gib * 1024**3),
        )
        # Leases this runtime holds; exit reports for anyone else's containers are ignored.
        self._leases: set[str] = set()
        self.disk = DiskGuard(
            self.containers.client,
            self._docker_root(),
            claim_label=LABEL_CLAIM,
            lease_label=LABEL_LEASE,
            agent_id=agent_id,
            floor_bytes=int(config.disk_floor_gib * 1024**3),
            stop_container=self.containers.stop_for_disk,
            default_allowance=self.containers.default_disk_allowance,
        )
        self.host_folders: tuple[str, ...] = (self.disk.root,)

    def _volumes_refusal(self, command: DockerRun) -> str | None:
        """Volumes kept from earlier leases may already hold more than this rental's
        allowance: refused now, rather than stopped at once for what it never wrote."""
        names = [renter_volume_name(v.name) for v in command.volumes]
        if command.cache_volume is not None:
            names.append(cache_volume_name(command.cache_volume.name))
        paths = []
        for name in names:
            try:
                paths.append(str(self.containers.client.api.inspect_volume(name)["Mountpoint"]))
            except NotFound:
                continue  # made empty with the container
        if not paths:
            return None
        allowance = command.disk_allowance_bytes or self.containers.default_disk_allowance
        return volumes_refusal(paths, allowance)

    def _docker_root(self) -> str:
        try:
            return str(self.containers.client.info().get("DockerRootDir") or "/var/lib/docker")
        except Exception:  # the engine answers later, or never: the usual place
            return "/var/lib/docker"

    async def gpus(self) -> list[GpuState]:
        return await asyncio.to_thread(self._list_gpus)

    def _list_gpus(self) -> list[GpuState]:
        gpus = self.nvml.gpus()
        self.health.watch(gpus)  # XIDs are delivered only once watched: from the first listing
        return gpus

    async def gpu_health(self) -> list[GpuHealth]:
        return await asyncio.to_thread(self.health.sample)

    async def host_facts(self) -> HostFacts:
        return await asyncio.to_thread(self._host_facts)

    def _host_facts(self) -> HostFacts:
        return HostFacts(
            disk_free_bytes=disk_free_bytes(self._docker_root()),
            driver_version=(self.nvml.driver_version() or "")[:32],
            cuda_version=(self.nvml.cuda_version() or "")[:16],
        )

    def _resolve(self, selector: tuple[int, ...] | tuple[str, ...]) -> tuple[int, ...]:
        indices: list[int] = []
        for item in selector:
            if isinstance(item, int):
                indices.append(item)
                continue
            index = self.nvml.index_for_uuid(item)
            if index is None:
                raise CommandFailed(f"this host has no GPU {item}")
            indices.append(index)
        return tuple(indices)

    def _container_pids(self, lease_id: str) -> frozenset[int]:
        """Host pids inside the lease's container: its own compute processes are not foreign."""
        container = self.containers.find(lease_id)
        if container is None or container.status != "running":
            return frozenset()
        try:
            top = container.top(ps_args="-eo pid")
        except DockerException:
            return frozenset()
        return frozenset(
            int(row[0]) for row in top.get("Processes") or [] if row and row[0].isdigit()
        )

    def _reserve(self, lease_id: str, indices: tuple[int, ...]) -> ReserveOutcome:
        try:
            result = self.claims.reserve(lease_id, indices, self._container_pids(lease_id))
        except ClaimRefused as exc:
            raise CommandFailed(exc.reason) from None
        self._leases.add(lease_id)
        return ReserveOutcome(gpu_indices=result.indices, warnings=result.warnings)

    async def reserve(
        self, lease_id: str, selector: tuple[int, ...] | tuple[str, ...]
    ) -> ReserveOutcome:
        indices = await asyncio.to_thread(self._resolve, selector)
        return await asyncio.to_thread(self._reserve, lease_id, indices)

    async def start(
        self, command: DockerRun, claim: Claim, *, output: LogSink | None = None
    ) -> RunOutcome:
        refusal = await asyncio.to_thread(self.disk.refusal)
        if refusal is None:
            refusal = await asyncio.to_thread(self._volumes_refusal, command)
        if refusal is not None:
            raise CommandFailed(refusal)
        uuids = [self.nvml.uuid_for_index(i) for i in claim.gpu_indices]
        if command.volumes:
            refusal = await asyncio.to_thread(self.janitor.refusal, command.volumes)
            if refusal is not None:
                raise CommandFailed(refusal)
            # Before the container: a sweep meanwhile must not take these for idle ones.
            await asyncio.to_thread(self.janitor.note_run, command.volumes)
        try:
            result = await asyncio.to_thread(
                self.containers.run,
                command,
                claim.gpu_indices,
                agent_id=self.agent_id,
                gpu_uuids=[u for u in uuids if u is not None],
                warmup_output=output,
            )
        except ContainerError as exc:
            raise CommandFailed(str(exc)) from None
        if command.cache_volume is not None:
            # The janitor's clock for this renter's cache starts again (volumes.py).
            await asyncio.to_thread(
                self.janitor.note_used, cache_volume_name(command.cache_volume.name)
            )
        return RunOutcome(
            container_id=result.container_id,
            ports={str(inner): outer for inner, outer in result.ports.items()},
            extra={"image_digest": result.image_digest} if result.image_digest else {},
        )

    def _release(self, lease_id: str) -> list[str]:
        # Order matters: the container goes first so that nothing of the renter's still runs
        # on the GPU when its compute mode is reset and the lock is dropped.
        try:
            self.containers.remove(lease_id)
        except ContainerError as exc:
            raise CommandFailed(f"could not remove the container: {exc}") from None
        warnings = self.claims.release(lease_id)
        self._leases.discard(lease_id)
        return warnings

    async def release(self, lease_id: str, claim: Claim | None) -> list[str]:
        return await asyncio.to_thread(self._release, lease_id)

    def _adopt(self, claims: dict[str, Claim]) -> set[str]:
        try:
            # At start too, not only before a rental: rules are gone after a reboot, and
            # adopted containers must not run unfiltered until the next rental.
            self.containers.ensure_egress()
        except ContainerError as exc:
            log.error("%s", exc)
        kept: set[str] = set()
        running = {c.lease_id: c for c in self.containers.list_claimed(self.agent_id)}
        for lease_id, claim in claims.items():
            container = running.get(lease_id)
            if claim.container_id is not None and (
                container is None or container.status != "running"
            ):
                log.info("lease %s: its container is gone or stopped; dropping the claim", lease_id)
                continue
            try:
                self.claims.reserve(lease_id, claim.gpu_indices, self._container_pids(lease_id))
            except ClaimRefused as exc:
                log.warning("lease %s: cannot re-claim its GPUs (%s); dropping it", lease_id, exc)
                continue
            self._leases.add(lease_id)
            kept.add(lease_id)
        for lease_id in set(running) - kept:
            log.info("removing container of lease %s: no claim owns it", lease_id)
            with contextlib.suppress(ContainerError):
                self.containers.remove(lease_id)
        orphaned = {i for lease, c in claims.items() if lease not in kept for i in c.gpu_indices}
        held = {i for lease in kept for i in claims[lease].gpu_indices}
        for warning in self.claims.restore_default_modes(sorted(orphaned - held)):
            log.warning("%s", warning)
        return kept

    async def adopt(self, claims: dict[str, Claim]) -> set[str]:
        return await asyncio.to_thread(self._adopt, claims)

    def watch_exits(self, report: ExitReport, stop: threading.Event) -> None:
        def on_exit(lease_id: str, exit_code: int) -> None:
            if lease_id not in self._leases:
                return
            container = self.containers.find(lease_id)
            info = self.containers.exit_info(container.id) if container is not None else None
            # The tail must fit a protocol frame (64 KiB); its end says the most.
            report(
                lease_id,
                exit_code,
                info[1][-LOG_TAIL_CHARS:] if info else "",
                info[2] if info else False,
            )

        self.containers.watch_exits(on_exit, stop)

    def watch_disk(self, send: Send, stop: threading.Event) -> None:
        self.disk.watch(send, stop)

    def _log_stream(self, container_id: str, tail: int) -> CancellableStream:
        # A stream another thread can close (see supplier_agent.compat_docker).
        api = self.containers.client.api
        try:
            tty = bool(api.inspect_container(container_id)["Config"].get("Tty"))
        except NotFound:
            raise CommandFailed("the lease's container is gone") from None
        params = {"stdout": 1, "stderr": 1, "follow": 1, "timestamps": 0, "tail": tail}
        return open_log_stream(api, container_id, params, tty=tty)

    def follow_logs(self, lease_id: str, tail: int, sink: LogSink, stop: threading.Event) -> None:
        container = self.containers.find(lease_id) if lease_id in self._leases else None
        if container is None:
            raise CommandFailed(f"lease {lease_id} has no container on this host")
        stream = self._log_stream(container.id, tail)

        def close_on_stop() -> None:
            stop.wait()
            with contextlib.suppress(Exception):
                close_stream(stream)

        closer = threading.Thread(target=close_on_stop, daemon=True)
        closer.start()
        try:
            for data in stream:
                sink(data)
        except Exception:
            if not stop.is_set():  # closing the stream under the reader is how it stops
                raise
        finally:
            stop.set()
            closer.join(timeout=10)

    def open_exec(self, message: ExecOpen) -> DockerExec:
        """A renter's terminal in their lease's running container (supplier_agent.terminals);
        only for leases this agent runs."""
        container = (
            self.containers.find(message.lease_id) if message.lease_id in self._leases else None
        )
        if container is None:
            raise CommandFailed(f"lease {message.lease_id} has no container on this host")
        if container.status != "running":
            raise CommandFailed(f"the rental's container is {container.status}, not running")
        return open_exec(
            self.containers.client.api,
            container.id,
            message.command,
            tty=message.tty,
            cols=message.cols,
            rows=message.rows,
        )

    async def container_pids(self, lease_ids: Iterable[str]) -> dict[str, list[int]]:
        def collect() -> dict[str, list[int]]:
            return {lease: sorted(self._container_pids(lease)) for lease in lease_ids}

        return await asyncio.to_thread(collect)

    async def prepull(self, images: Iterable[str]) -> None:
        for image in images:
            try:
                # Pulled even when a copy is here: that copy may be the supplier's own build,
                # and only the registry's is what a rental of the name gets (obtain_image).
                await asyncio.to_thread(self.containers.pull, image)
            except ContainerError as exc:
                log.warning("pre-pull of %s failed: %s", image, exc)

    async def housekeeping(self) -> None:
        try:
            await asyncio.to_thread(self.janitor.sweep)
        except (DockerException, OSError, requests.RequestException) as exc:
            log.warning("volume housekeeping failed: %s", exc)

    async def volume_reports(self, *, measure: bool) -> list[VolumeReport]:
        def report() -> list[VolumeReport]:
            if measure:
                self.janitor.measure()
            return self.janitor.reports()

        try:
            return await asyncio.to_thread(report)
        except (DockerException, OSError, requests.RequestException) as exc:
            log.warning("cannot report volumes: %s", exc)
            return []

    async def delete_volume(self, name: str) -> bool:
        try:
            return await asyncio.to_thread(self.janitor.delete, name)
        except (DockerException, OSError, requests.RequestException) as exc:
            # It stays on the list: the next sweep tries again.
            log.warning("deleting volume %s failed: %s", name, exc)
            return False

    async def delete_pending_volumes(self) -> bool:
        try:
            return await asyncio.to_thread(self.janitor.delete_pending)
        except (DockerException, OSError, requests.RequestException) as exc:
            log.warning("deleting volumes failed: %s", exc)
            return False

    async def close(self) -> None:
        await asyncio.to_thread(self.containers.close)
        await asyncio.to_thread(self.nvml.shutdown)
