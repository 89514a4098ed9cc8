"""Renters' containers on this host, through the Docker SDK (never a shell, never the CLI).

One container per lease, named ``cloudgpu-<lease_id>`` and labelled with the claiming agent,
the lease, its declared ports and its GPUs, so that a restarted agent rebuilds its view from
Docker alone. Every call blocks; the agent runs them in ``asyncio.to_thread``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
import shlex
import shutil
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.models.containers import Container
from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

from supplier_agent import image_policy, protocol
from supplier_agent.container_events import ExitCallback, ExitWatcher, close_stream
from supplier_agent.disk_guard import DEFAULT_ALLOWANCE_BYTES, LABEL_ALLOWANCE
from supplier_agent.egress import EgressError, EgressPolicy
from supplier_agent.limits import HostResources, Reserve, lease_limits, nofile_limit
from supplier_agent.protocol import DockerRun, ProtocolError
from supplier_agent.toolkit import toolkit_refusal, toolkit_version

log = logging.getLogger(__name__)

LABEL_CLAIM = "cloudgpu.claim"
LABEL_LEASE = "cloudgpu.lease"
LABEL_PORTS = "cloudgpu.ports"
LABEL_GPUS = "cloudgpu.gpus"
LABEL_CACHE = "cloudgpu.cache"
# A volume a renter made (issue 13): its wire name (vol-<40 hex>), and the cap it was made with.
LABEL_VOLUME = "cloudgpu.volume"
LABEL_VOLUME_CAP = "cloudgpu.volume.size_bytes"
LEGACY_SHARED_CACHE_PREFIX = "template-"
LABEL_NETWORK = "cloudgpu.network"
# What the container was created from (ObtainedImage.digest): the ack reports it again when a
# retried docker_run finds the container made already.
LABEL_IMAGE_DIGEST = "cloudgpu.image.digest"
# Every lease's container sits on this bridge, which drops traffic between its containers:
# Docker's default bridge lets one tenant reach another's ports directly.
NETWORK = "cloudgpu"
NETWORK_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}
# Docker before 25 lets concurrent creates make several networks of one name: one at a time here.
_network_lock = threading.Lock()
LOG_TAIL_LINES = 50
LOG_TAIL_CHARS = 8000  # fits ContainerExited.log_tail and keeps an ack's error readable
# What Docker keeps of one lease's output on the supplier's disk. Its default (json-file, no
# limit) kept everything: one lease printing 64 KiB/s wrote 484 MB/h under /var/lib/docker.
# The `local` driver rotates through LOG_FILES files (compressing the older ones); the live
# follower and the exit tail (the last LOG_TAIL_LINES lines) read it as before. Set
# explicitly, so a daemon whose default driver cannot be read back (syslog) still has logs.
CONTAINER_LOG_MIB = 64
LOG_DRIVER = "local"
LOG_FILES = 4
PORT_BIND_TIMEOUT_S = 30.0
PULL_LOG_EVERY_S = 5.0
# Every capability is dropped and only these come back: what ordinary images need as root in
# their own container (README, "What a rental can reach and use"). CHOWN, DAC_OVERRIDE and
# FOWNER: entrypoints that fix ownership of volumes, pip and apt writing as root into files of
# other users. SETUID and SETGID: gosu/su/sudo entrypoints (Jupyter's start script, ComfyUI's),
# apt dropping to _apt, sshd's privilege separation. SYS_CHROOT: sshd's pre-auth sandbox.
# AUDIT_WRITE: sshd refuses logins without it. KILL: a root supervisor (tini, Jupyter) signals
# the processes it started as another user.
# Gone from Docker's default set: NET_RAW (ARP/DNS spoofing of neighbours on the bridge), MKNOD
# (device nodes), SETFCAP and SETPCAP (file and process capabilities), FSETID (keeping setuid
# bits on changed files), NET_BIND_SERVICE (not needed: Docker sets the container's
# net.ipv4.ip_unprivileged_port_start to 0, so any user binds ports below 1024).
RENTAL_CAPS = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "KILL",
    "SETGID",
    "SETUID",
    "SYS_CHROOT",
)
GPU_TOOLKIT_HINT = (
    "this host's Docker cannot give containers GPUs: "
    "install nvidia-container-toolkit and restart Docker"
)
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")

P = ParamSpec("P")
T = TypeVar("T")


class ContainerError(RuntimeError):
    """A container could not be run or managed; ``str()`` says what a person can do about it."""


@dataclass(frozen=True)
class RunResult:
    container_id: str
    ports: dict[int, int]  # container port -> host port on 127.0.0.1
    # What ran: "<repository>@sha256:<digest>" as pulled from its registry, or, where the
    # supplier rents out images of their own host, the local image's id ("sha256:<id>").
    image_digest: str = ""


@dataclass(frozen=True)
class ObtainedImage:
    """The image a lease's container is created from, pinned: a later retag cannot swap it."""

    ref: str  # what Docker creates the container from
    digest: str  # what the lease records
    local: bool  # taken from the host without a pull (the supplier's opt-in)


@dataclass(frozen=True)
class ClaimedContainer:
    lease_id: str
    container_id: str
    agent_id: str
    status: str  # Docker's: created, running, exited, dead, ...
    gpu_indices: tuple[int, ...] = ()
    ports: dict[int, int] = field(default_factory=dict)


def container_log_config(max_bytes: int) -> LogConfig:
    """Docker's log options for at most ``max_bytes`` of a container's output on disk."""
    per_file_kib = max(64, max_bytes // LOG_FILES // 1024)
    return LogConfig(
        type=LOG_DRIVER,
        config={"max-size": f"{per_file_kib}k", "max-file": str(LOG_FILES), "compress": "true"},
    )


def _discard(data: bytes) -> None:
    """Where a warm-up's output goes when nobody streams it (only its last lines are kept)."""


def _engine_errors(method: Callable[P, T]) -> Callable[P, T]:
    """Turn a dead engine or an unclassified Docker refusal into a ContainerError."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except requests.exceptions.ConnectionError as exc:
            raise ContainerError(
                "the Docker engine is not reachable: is dockerd running, "
                "and may the agent's user use its socket?"
            ) from exc
        except APIError as exc:
            raise ContainerError(f"Docker refused the request: {exc.explanation or exc}") from exc

    return wrapper


class ContainerRuntime:
    """Hardened, idempotent per-lease containers.

    ``gpu_devices="none"`` attaches no GPUs: it is for testing the control plane on a host
    without the NVIDIA container toolkit, never for renters.
    """

    def __init__(
        self,
        client: docker.DockerClient | None = None,
        *,
        gpu_devices: str = "nvidia",
        stop_grace_s: int = 10,
        pids_limit: int = 4096,
        shm_size: str = "8g",
        host_gpus: int = 1,
        reserve: Reserve | None = None,
        host: HostResources | None = None,
        egress: EgressPolicy | None = None,
        toolkit_risk_accepted: bool = False,
        log_max_bytes: int = CONTAINER_LOG_MIB * 1024 * 1024,
        allow_local_images: bool = False,
        default_disk_allowance: int = DEFAULT_ALLOWANCE_BYTES,
    ) -> None:
        if gpu_devices not in {"nvidia", "none"}:
            raise ValueError("gpu_devices must be 'nvidia' or 'none'")
        self._owns_client = client is None
        if client is None:
            try:
                client = docker.from_env()
            except DockerException as exc:
                raise ContainerError(f"the Docker engine is not reachable: {exc}") from exc
        self.client = client
        self.gpu_devices = gpu_devices
        self.stop_grace_s = stop_grace_s
        self.pids_limit = pids_limit
        self.shm_size = shm_size
        # A lease's memory and CPUs: its GPUs' share of the host (limits.py).
        self.host_gpus = host_gpus
        self.reserve = reserve or Reserve()
        self.host = host or HostResources.read()
        # The packet filter between rentals and the supplier's network (egress.py); None only
        # where a caller filters otherwise (tests of other things).
        self.egress = egress
        # The supplier's opt-in to GPU rentals on a toolkit with CVE-2025-23266 (toolkit.py).
        self.toolkit_risk_accepted = toolkit_risk_accepted
        # The most a lease's output takes on the supplier's disk, across its rotated files.
        self.log_max_bytes = log_max_bytes
        # The supplier's opt-in to renting out images that exist only on this host (their own
        # builds; the local trial and the tests, which have no registry). Off, every rental
        # pulls its image anonymously from its registry, so the supplier's private images and
        # whatever they pulled with their credentials are never a renter's to run.
        self.allow_local_images = allow_local_images
        # A lease's disk allowance when the hub sends none (hubs from before allowances).
        self.default_disk_allowance = default_disk_allowance
        # Whether Docker takes --storage-opt size= here; None until the first create tells.
        self.storage_quota: bool | None = None
        # Containers we stop ourselves: their "die" is not an exit to report.
        self._exits = ExitWatcher(client, claim_label=LABEL_CLAIM, lease_label=LABEL_LEASE)

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    @_engine_errors
    def image_present(self, ref: str) -> bool:
        try:
            self.client.images.get(ref)
        except ImageNotFound:
            return False
        return True

    @_engine_errors
    def pull(self, ref: str) -> None:
        """Pull ``ref`` anonymously, with progress in the log.

        Never with the supplier's credentials: docker-py would send those of the user's Docker
        config (``~/.docker/config.json``) for the image's registry, and a renter naming the
        supplier's private image would get it. An explicit empty auth config sends none."""
        log.info("pulling image %s", ref)
        started = last_report = time.monotonic()
        error: str | None = None
        try:
            # Read to the end even after an error event, so that the response gets closed.
            events = self.client.api.pull(ref, stream=True, decode=True, auth_config={})
            for event in events:
                if "error" in event:
                    error = (event.get("errorDetail") or {}).get("message") or event["error"]
                elif event.get("status") == "Pull complete":
                    log.info("pulling %s: layer %s done", ref, event.get("id"))
                elif time.monotonic() - last_report >= PULL_LOG_EVERY_S:
                    last_report = time.monotonic()
                    status = f"{event.get('status', '')} {event.get('progress', '')}".strip()
                    log.info("pulling %s: %s (%.0f s)", ref, status, last_report - started)
        except APIError as exc:
            error = exc.explanation or str(exc)
        if error is not None:
            raise _pull_error(ref, error)
        if not self.image_present(ref):
            raise ContainerError(f"pulling image {ref} ended without the image")
        log.info("pulled image %s in %.0f s", ref, time.monotonic() - started)

    @_engine_errors
    def obtain_image(self, ref: str) -> ObtainedImage:
        """The image a rental of ``ref`` runs: pulled from its registry for it (anonymously,
        so Docker checks the registry even when the layers are here), pinned by digest.

        An image that exists only on this host is refused with the sentence a missing one
        gets, so that renters cannot probe which private images the supplier has; with the
        supplier's ``allow_local_images`` a local copy is used as it is, pinned by its id.
        """
        if self.allow_local_images:
            with contextlib.suppress(ImageNotFound):
                local = self.client.images.get(ref)
                return ObtainedImage(ref=str(local.id), digest=str(local.id), local=True)
        self.pull(ref)
        digest = registry_digest(ref, self.client.images.get(ref).attrs)
        if digest is None:
            # Docker answered the pull without a digest for this repository: nothing says
            # this came from the registry, so it is treated as absent there.
            log.warning("image %s has no registry digest after its pull; refusing it", ref)
            raise ContainerError(not_found_message(ref))
        return ObtainedImage(ref=digest, digest=digest, local=False)

    @_engine_errors
    def create(
        self,
        spec: DockerRun,
        gpu_indices: Sequence[int],
        *,
        agent_id: str,
        gpu_uuids: Sequence[str] = (),
    ) -> str:
        """Create (pulling first if needed) the lease's container; an existing one is reused.

        ``gpu_uuids`` (the claimed GPUs' NVML UUIDs, same order) name the devices when known:
        indices can be renumbered by a driver reload, UUIDs cannot."""
        self._check(spec, gpu_indices)
        existing = self.find(spec.lease_id)
        if existing is not None:
            return str(existing.id)
        # Before the local copy is even looked at: an image of the supplier's own private
        # registry, already here, is no more a renter's to run than one still to pull.
        refusal = image_policy.resolved_refusal(spec.image)
        if refusal is not None:
            raise ContainerError(refusal)
        image = self.obtain_image(spec.image)
        refusal = image_policy.image_env_refusal(
            spec.image, image_policy.config_env(self.client.images.get(image.ref).attrs)
        )
        if refusal is not None:
            raise ContainerError(refusal)
        options = self._create_options(spec, gpu_indices, agent_id, gpu_uuids)
        options["image"] = image.ref
        options["labels"][LABEL_IMAGE_DIGEST] = image.digest
        allowance = spec.disk_allowance_bytes or self.default_disk_allowance
        options["labels"][LABEL_ALLOWANCE] = str(allowance)
        try:
            container = self._create_sized(options, allowance)
        except APIError as exc:
            # 409: a concurrent create for the same lease won the name; that is our container.
            found = self.find(spec.lease_id) if exc.status_code == 409 else None
            if found is not None:
                return str(found.id)
            raise ContainerError(
                f"Docker refused to create the container: {exc.explanation}"
            ) from exc
        gpus = ",".join(map(str, gpu_indices)) or "-"
        log.info("created %s for lease %s, GPUs %s", container.short_id, spec.lease_id, gpus)
        return str(container.id)

    def _create_sized(self, options: dict[str, Any], allowance: int) -> Container:
        """Create with the writable layer limited to the allowance where the storage driver
        can (overlay2 on xfs with pquota); elsewhere the disk guard alone bounds it."""
        if self.storage_quota is not False:
            try:
                container = self.client.containers.create(
                    **options, network=self._network(), storage_opt={"size": str(allowance)}
                )
            except APIError as exc:
                if "storage-opt" not in str(exc.explanation or exc).lower():
                    raise
                log.info("Docker's storage driver takes no size limit here: %s", exc.explanation)
                self.storage_quota = False
            else:
                self.storage_quota = True
                return container
        return self.client.containers.create(**options, network=self._network())

    @_engine_errors
    def stop_for_disk(self, container_id: str) -> None:
        """Kill a container the disk guard stopped: its exit is reported by the guard, with
        the reason, not as an ordinary exit."""
        self._exits.ignore(container_id)
        try:
            self.client.api.kill(container_id)
        except NotFound:
            pass
        except APIError as exc:
            if exc.status_code != 409:  # 409: not running any more
                raise

    @_engine_errors
    def start(self, container_id: str) -> dict[int, int]:
        """Start the container; return {container port: host port} once Docker has bound them."""
        container = self.client.containers.get(container_id)
        if container.status != "running":
            try:
                container.start()
            except APIError as exc:
                if "could not select device driver" in str(exc.explanation):
                    raise ContainerError(GPU_TOOLKIT_HINT) from exc
                raise ContainerError(
                    f"Docker could not start the container: {exc.explanation}"
                ) from exc
        declared = _int_list(container.labels.get(LABEL_PORTS, ""))
        deadline = time.monotonic() + PORT_BIND_TIMEOUT_S
        while True:
            container.reload()
            ports = _host_ports(container.attrs, declared)
            if len(ports) == len(declared):
                return ports
            self._fail_if_exited(container, "before its ports were published")
            if time.monotonic() > deadline:
                raise ContainerError(f"Docker did not publish ports {declared} in time")
            time.sleep(0.2)

    @_engine_errors
    def run(
        self,
        spec: DockerRun,
        gpu_indices: Sequence[int],
        *,
        agent_id: str,
        ready_timeout_s: float = 300,
        gpu_uuids: Sequence[str] = (),
        warmup_output: Callable[[bytes], None] | None = None,
    ) -> RunResult:
        """Create, start, wait for every declared port, warm up; a failed start is removed.

        ``ready_timeout_s`` counts from the start, so a long pull does not eat into it.
        ``warmup_output`` gets the warm-up's output as it comes (a line naming it first, one
        saying it finished last), for the renter's live page.
        """
        if self.gpu_devices == "nvidia":
            refusal = toolkit_refusal(toolkit_version(), risk_accepted=self.toolkit_risk_accepted)
            if refusal is not None:
                raise ContainerError(refusal)
        self.ensure_egress()
        existing = self.find(spec.lease_id)
        already_running = existing is not None and existing.status == "running"
        container_id = self.create(spec, gpu_indices, agent_id=agent_id, gpu_uuids=gpu_uuids)
        try:
            ports = self.start(container_id)
            deadline = time.monotonic() + ready_timeout_s
            self._wait_ready(container_id, ports, deadline, ready_timeout_s)
            if spec.warmup:
                # Also for a container found running: a docker_run comes again only when its
                # ack never went out, e.g. the agent was killed mid-warm-up, and nothing records
                # that a warm-up finished. Warm-ups are meant to be safe to repeat (downloads,
                # compiles); skipping one reported a cold rental as running.
                self._warm_up(
                    spec.lease_id, container_id, spec.warmup, deadline, output=warmup_output
                )
        except (ContainerError, DockerException):
            # A half-started container would hold the GPUs and later surface as an "exit"; a
            # retried docker_run starts from scratch. A renter's running one is left alone.
            if not already_running:
                with contextlib.suppress(DockerException, requests.RequestException):
                    self._remove_container(spec.lease_id, container_id)
            raise
        log.info("lease %s running in %s, ports %s", spec.lease_id, container_id[:12], ports)
        labels = self.client.containers.get(container_id).labels or {}
        return RunResult(
            container_id=container_id,
            ports=ports,
            image_digest=str(labels.get(LABEL_IMAGE_DIGEST, "")),
        )

    @_engine_errors
    def find(self, lease_id: str) -> Container | None:
        found = self._lease_containers(lease_id)
        return found[0] if found else None

    @_engine_errors
    def remove(self, lease_id: str) -> bool:
        """Stop (SIGTERM, SIGKILL after the grace) and remove; False if there was nothing."""
        removed = False
        for container in self._lease_containers(lease_id):
            removed = self._remove_container(lease_id, container.id) or removed
        return removed

    @_engine_errors
    def list_claimed(self, agent_id: str | None = None) -> list[ClaimedContainer]:
        """Containers labelled ``cloudgpu.claim`` (by ``agent_id``, or by any agent)."""
        label = LABEL_CLAIM if agent_id is None else f"{LABEL_CLAIM}={agent_id}"
        claimed = []
        # The summary listing is one call and cannot race with a removal, unlike inspecting.
        for row in self.client.api.containers(all=True, filters={"label": label}):
            labels = row.get("Labels") or {}
            ports = {
                int(p["PrivatePort"]): int(p["PublicPort"])
                for p in row.get("Ports") or []
                if p.get("PublicPort") and p.get("Type") == "tcp" and p.get("IP") == "127.0.0.1"
            }
            lease_id, owner = labels.get(LABEL_LEASE, ""), labels.get(LABEL_CLAIM, "")
            gpus = tuple(_int_list(labels.get(LABEL_GPUS, "")))
            claimed.append(ClaimedContainer(lease_id, row["Id"], owner, row["State"], gpus, ports))
        return claimed

    @_engine_errors
    def exit_info(self, container_id: str) -> tuple[int, str, bool] | None:
        """(exit code, last log lines, OOM-killed) once the container has exited; None before,
        or if gone."""
        try:
            state = self.client.api.inspect_container(container_id)["State"]
        except NotFound:
            return None
        if state.get("Status") not in {"exited", "dead"}:
            return None
        oom = bool(state.get("OOMKilled"))
        return int(state.get("ExitCode", -1)), self._log_tail(container_id), oom

    def watch_exits(
        self, callback: ExitCallback, stop_event: threading.Event, *, since: float | None = None
    ) -> None:
        """Call ``callback(lease_id, exit_code)`` for each claimed container that dies on its own.

        Blocks until ``stop_event`` is set; see ``ExitWatcher.watch``.
        """
        self._exits.watch(callback, stop_event, since=since)

    # --- internals ----------------------------------------------------------------------------

    def _check(self, spec: DockerRun, gpu_indices: Sequence[int]) -> None:
        # The protocol refused these already, but a DockerRun built in code never went through it.
        try:
            protocol.validate_image(spec.image, "image")
            protocol.validate_env(dict(spec.env), "env")
            for port in spec.ports:
                protocol.validate_port(port, "port")
            if spec.cache_volume is not None:
                cache = {"name": spec.cache_volume.name, "path": spec.cache_volume.path}
                protocol.CacheVolume.parse(cache, "cache_volume")
            volumes = [dataclasses.asdict(volume) for volume in spec.volumes]
            protocol.validate_volumes(volumes, spec.cache_volume, "volumes")
        except ProtocolError as exc:
            raise ContainerError(f"refusing to run lease {spec.lease_id}: {exc}") from None
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in gpu_indices):
            raise ContainerError(f"GPU indices must be whole numbers, not {list(gpu_indices)}")
        if self.gpu_devices == "nvidia" and not gpu_indices:
            raise ContainerError(f"lease {spec.lease_id} has no claimed GPU for its container")

    def _create_options(
        self, spec: DockerRun, gpu_indices: Sequence[int], agent_id: str, gpu_uuids: Sequence[str]
    ) -> dict[str, Any]:
        mounts = []
        if spec.cache_volume is not None:
            volume = self._cache_volume(spec.cache_volume.name)
            mounts.append(Mount(target=spec.cache_volume.path, source=volume, type="volume"))
        for renter_volume in spec.volumes:
            volume = self._renter_volume(renter_volume)
            mounts.append(Mount(target=renter_volume.path, source=volume, type="volume"))
        devices = None
        # Set explicitly, over whatever the image says (CUDA images say "all"): where the NVIDIA
        # runtime is dockerd's default, that variable alone hands a container every GPU of the
        # host, other renters' included. "void" gives none.
        visible = "void"
        if self.gpu_devices == "nvidia":
            ids = list(gpu_uuids) if len(gpu_uuids) == len(gpu_indices) else []
            ids = ids or [str(i) for i in gpu_indices]
            devices = [DeviceRequest(driver="nvidia", device_ids=ids, capabilities=[["gpu"]])]
            visible = ",".join(ids)
        limits = lease_limits(self.host, len(gpu_indices), self.host_gpus, self.reserve)
        nofile = nofile_limit()
        environment = [f"{name}={value}" for name, value in spec.env.items()]
        environment.append(f"NVIDIA_VISIBLE_DEVICES={visible}")
        # PID and IPC modes stay unset: Docker's defaults are private namespaces. The network is
        # the isolated bridge, never the default one or the host's.
        return {
            "image": spec.image,
            "name": f"cloudgpu-{spec.lease_id}",
            "command": list(spec.command) if spec.command is not None else None,
            "entrypoint": list(spec.entrypoint) if spec.entrypoint is not None else None,
            "environment": environment,
            "user": spec.user,
            "labels": {
                LABEL_CLAIM: agent_id,
                LABEL_LEASE: spec.lease_id,
                LABEL_PORTS: ",".join(map(str, spec.ports)),
                LABEL_GPUS: ",".join(map(str, gpu_indices)),
            },
            # Loopback only: the tunnel is the one way in from outside.
            "ports": {f"{port}/tcp": ("127.0.0.1", None) for port in spec.ports},
            "mounts": mounts,
            "device_requests": devices,
            "shm_size": self.shm_size,
            "privileged": False,
            "security_opt": ["no-new-privileges:true"],
            "pids_limit": self.pids_limit,
            "mem_limit": limits.memory_bytes,
            # The same as the memory limit: no swap on top, so a bomb is OOM-killed, not paged.
            "memswap_limit": limits.memory_bytes,
            "nano_cpus": limits.nano_cpus,
            "ulimits": [
                Ulimit(name="nofile", soft=nofile, hard=nofile),
                Ulimit(name="core", soft=0, hard=0),
            ],
            "cap_drop": ["ALL"],
            "cap_add": list(RENTAL_CAPS),
            "log_config": container_log_config(self.log_max_bytes),
            "restart_policy": {"Name": "no"},
            "detach": True,
        }

    def _cache_volume(self, name: str) -> str:
        if name.startswith(LEGACY_SHARED_CACHE_PREFIX):
            # What hubs before per-renter caches sent: one volume for every renter of a
            # template, whose files one renter could plant for the next.
            raise ContainerError(
                f"cache volume {name} would be shared between renters; this agent mounts only "
                "per-renter caches (upgrade the hub)"
            )
        volume_name = cache_volume_name(name)
        try:
            volume = self.client.volumes.get(volume_name)
        except NotFound:
            volume = self.client.volumes.create(volume_name, labels={LABEL_CACHE: name})
        # The local driver's "device" option makes a named volume a host bind mount in disguise.
        if "device" in (volume.attrs.get("Options") or {}):
            raise ContainerError(f"volume {volume_name} is a host bind mount; refusing to mount it")
        return volume_name

    def _renter_volume(self, spec: protocol.RenterVolume) -> str:
        volume_name = renter_volume_name(spec.name)
        try:
            volume = self.client.volumes.get(volume_name)
        except NotFound:
            labels = {LABEL_VOLUME: spec.name}
            if spec.size_bytes is not None:
                labels[LABEL_VOLUME_CAP] = str(spec.size_bytes)
            volume = self.client.volumes.create(volume_name, labels=labels)
        # Not one we made for this renter volume (a supplier's own of that name): never mount it.
        if (volume.attrs.get("Labels") or {}).get(LABEL_VOLUME) != spec.name:
            raise ContainerError(f"volume {spec.name} on this host is not a renter volume")
        if "device" in (volume.attrs.get("Options") or {}):
            raise ContainerError(f"volume {spec.name} is a host bind mount; refusing to mount it")
        return volume_name

    @_engine_errors
    def ensure_egress(self) -> str | None:
        """Install the egress rules for the lease bridge; the bridge's interface name (None
        without a policy). A failure refuses the rental: it would reach the supplier's LAN."""
        if self.egress is None:
            return None
        self._network()
        bridges = [bridge_interface(row) for row in self._networks()]
        try:
            for bridge in bridges:
                self.egress.install(bridge)
        except EgressError as exc:
            raise ContainerError(
                f"this host cannot keep rentals off its own network, so it takes none: {exc}"
            ) from None
        return bridges[0] if bridges else None

    def _network(self) -> str:
        """The isolating bridge for leases, created on first use (by whichever agent is first)."""
        with _network_lock:
            rows = self._networks() or self._create_network()
        # Two agents racing on one host can still make two: all agents pick the same one.
        network = min(rows, key=lambda row: str(row["Id"]))
        options = network.get("Options") or {}
        if network.get("Driver") != "bridge" or any(
            options.get(key) != value for key, value in NETWORK_OPTIONS.items()
        ):
            raise ContainerError(
                f"Docker network {NETWORK} exists but lets containers reach each other; "
                f"remove it (docker network rm {NETWORK}) and the agent recreates it isolated"
            )
        return NETWORK if len(rows) == 1 else str(network["Id"])

    def _create_network(self) -> list[dict[str, Any]]:
        try:
            self.client.api.create_network(
                NETWORK,
                driver="bridge",
                options=NETWORK_OPTIONS,
                labels={LABEL_NETWORK: "1"},
                check_duplicate=True,
            )
        except APIError as exc:
            if exc.status_code != 409:  # 409: another agent created it a moment ago
                raise
        rows = self._networks()
        if not rows:
            raise ContainerError(f"Docker network {NETWORK} vanished as it was created")
        return rows

    def _networks(self) -> list[dict[str, Any]]:
        # Docker's name filter matches substrings.
        return [n for n in self.client.api.networks(names=[NETWORK]) if n.get("Name") == NETWORK]

    def _lease_containers(self, lease_id: str) -> list[Container]:
        found = self.client.containers.list(
            all=True, filters={"label": f"{LABEL_LEASE}={lease_id}"}, ignore_removed=True
        )
        return list(found)

    def _wait_ready(
        self, container_id: str, ports: dict[int, int], deadline: float, timeout_s: float
    ) -> None:
        container = self.client.containers.get(container_id)
        while ports := {port: host for port, host in ports.items() if not _port_answers(host)}:
            container.reload()
            self._fail_if_exited(container, "before its ports were ready")
            if time.monotonic() > deadline:
                listed = ", ".join(map(str, ports))
                raise ContainerError(
                    f"port {listed} did not accept connections within {timeout_s:.0f} s"
                )
            time.sleep(0.5)

    def _warm_up(
        self,
        lease_id: str,
        container_id: str,
        command: Sequence[str],
        deadline: float,
        *,
        output: Callable[[bytes], None] | None = None,
    ) -> None:
        shown = shlex.join(command)
        sink = output or _discard
        sink(f"[warm-up] {shown}\n".encode())
        exec_id = self.client.api.exec_create(container_id, list(command))["Id"]
        timed_out = threading.Event()

        def on_deadline() -> None:
            # The exec stream has no read timeout: killing the container is what ends it.
            timed_out.set()
            self._exits.ignore(container_id)
            with contextlib.suppress(DockerException, requests.RequestException):
                self.client.api.kill(container_id)

        timer = threading.Timer(max(0.0, deadline - time.monotonic()), on_deadline)
        timer.daemon = True
        timer.start()
        lines: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        stream = self.client.api.exec_start(exec_id, stream=True)
        try:
            partial = ""
            for chunk in stream:
                sink(chunk)
                *complete, partial = (partial + chunk.decode("utf-8", "replace")).split("\n")
                lines.extend(complete)
            lines.append(partial)
        finally:
            timer.cancel()
            close_stream(stream)
        if timed_out.is_set():
            raise ContainerError(f"warm-up `{shown}` did not finish in time")
        # The stream can end a moment before Docker records the exit code.
        settle = time.monotonic() + 10
        while (state := self.client.api.exec_inspect(exec_id))["Running"]:
            if time.monotonic() > settle:
                break
            time.sleep(0.1)
        if state.get("ExitCode") != 0:
            tail = "\n".join(lines).strip()[-LOG_TAIL_CHARS:]
            raise ContainerError(
                f"warm-up `{shown}` failed with exit code {state.get('ExitCode')}; "
                f"last lines:\n{tail}"
            )
        sink(b"\n[warm-up] finished\n" if partial else b"[warm-up] finished\n")

    def _fail_if_exited(self, container: Container, when: str) -> None:
        if container.status in {"exited", "dead"}:
            code = container.attrs.get("State", {}).get("ExitCode", -1)
            tail = self._log_tail(container.id)
            raise ContainerError(
                f"the container exited with code {code} {when}; last log lines:\n{tail}"
            )

    def _log_tail(self, container_id: str) -> str:
        try:
            raw = self.client.api.logs(container_id, stdout=True, stderr=True, tail=LOG_TAIL_LINES)
        except NotFound:
            return ""
        text: str = raw.decode("utf-8", "replace")
        return text[-LOG_TAIL_CHARS:]

    def _remove_container(self, lease_id: str, container_id: str) -> bool:
        self._exits.ignore(container_id)
        try:
            # SIGTERM (or the image's STOPSIGNAL) first, so that a job can checkpoint.
            self.client.api.stop(container_id, timeout=self.stop_grace_s)
            # v=True drops anonymous volumes only: Docker never removes a named cache here.
            self.client.api.remove_container(container_id, v=True, force=True)
        except NotFound:
            return False
        except APIError as exc:
            if exc.status_code == 409:  # a concurrent remove() is already at it
                return False
            raise
        log.info("removed container %s of lease %s", container_id[:12], lease_id)
        return True


def _pull_error(ref: str, detail: str) -> ContainerError:
    # The renter gets a sentence; dockerd's own text (addresses, resolver and proxy details of
    # the supplier's network) stays in the supplier's log.
    log.warning("pulling image %s failed: %s", ref, detail)
    lowered = detail.lower()
    denied = ("not found", "manifest unknown", "pull access denied", "unauthorized", "denied")
    if any(marker in lowered for marker in denied):
        return ContainerError(not_found_message(ref))
    unreachable = ("dial tcp", "no such host", "timeout", "connection refused", "tls", "eof")
    if any(marker in lowered for marker in unreachable):
        return ContainerError(f"the registry of image {ref} is unreachable from this host")
    return ContainerError(f"pulling image {ref} failed on this host")


# What Docker takes for Docker Hub besides no registry at all.
DOCKER_HUB_NAMES = ("docker.io", "index.docker.io", "registry-1.docker.io")


def not_found_message(ref: str) -> str:
    """What a renter reads for an image missing from its registry, whether or not a copy of
    it is on this host."""
    return f"image {ref} not found in its registry or access denied"


def registry_digest(ref: str, attrs: dict[str, Any]) -> str | None:
    """``<repository>@sha256:...`` of ``ref``'s repository from an image's ``RepoDigests``
    (None: not pulled from that repository's registry)."""
    repository = _repository(ref)
    for entry in attrs.get("RepoDigests") or []:
        name, _, digest = str(entry).partition("@")
        if digest.startswith("sha256:") and _repository(name) == repository:
            return f"{name}@{digest}"
    return None


def _repository(ref: str) -> str:
    """The repository of a reference, as Docker normalises it: no tag or digest, Docker Hub's
    implicit ``docker.io/`` and ``library/`` made explicit."""
    name = ref.partition("@")[0]
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name = name[:colon]
    registry = image_policy.registry_of(name)
    if registry in DOCKER_HUB_NAMES:  # Docker Hub by one of its other names
        name = name.partition("/")[2]
        registry = None
    if registry is None:
        name = "docker.io/" + (name if "/" in name else "library/" + name)
    return name


def cache_volume_name(name: str) -> str:
    """The Docker volume behind a lease's ``cache_volume.name``."""
    return f"cloudgpu-cache-{name}"


def renter_volume_name(name: str) -> str:
    """The Docker volume behind a renter volume's wire name (``vol-<40 hex>``)."""
    return f"cloudgpu-{name}"


def bridge_interface(network: dict[str, Any]) -> str:
    """The host interface of a Docker bridge network: its own name option, else br-<id>."""
    options = network.get("Options") or {}
    return str(options.get("com.docker.network.bridge.name") or f"br-{network['Id'][:12]}")


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip().isdigit()]


def _host_ports(attrs: dict[str, Any], declared: Sequence[int]) -> dict[int, int]:
    bound = (attrs.get("NetworkSettings") or {}).get("Ports") or {}
    ports = {}
    for port in declared:
        for binding in bound.get(f"{port}/tcp") or []:
            if binding.get("HostIp") == "127.0.0.1" and binding.get("HostPort"):
                ports[port] = int(binding["HostPort"])
    return ports


def _port_answers(host_port: int) -> bool:
    """Whether a server inside the container answers on its published loopback port.

    With Docker's userland proxy (the default) a connect to the host port always succeeds, and
    the proxy hangs up at once when nothing listens inside: an immediate EOF means not ready,
    while data or silence (a server waiting for its client to speak, as HTTP does) means ready.
    """
    try:
        with socket.create_connection(("127.0.0.1", host_port), timeout=1) as conn:
            conn.settimeout(0.3)
            try:
                return conn.recv(1) != b""
            except TimeoutError:
                return True
    except OSError:
        return False


def nvidia_runtime_available(client: docker.DockerClient) -> bool:
    """Whether this host's Docker can give containers GPUs (for ``doctor``).

    The NVIDIA container toolkit shows as Docker's "nvidia" runtime, as CDI specs
    (``nvidia-ctk cdi generate``), or as its hook on PATH, which is what enables Docker's
    built-in "nvidia" device driver behind ``--gpus``.
    """
    try:
        info = client.info()
    except (DockerException, requests.RequestException):
        return False
    if "nvidia" in (info.get("Runtimes") or {}):
        return True
    for folder in info.get("CDISpecDirs") or CDI_SPEC_DIRS:
        with contextlib.suppress(OSError):
            if any("nvidia" in spec.name for spec in Path(folder).iterdir()):
                return True
    return shutil.which("nvidia-container-runtime-hook") is not None
