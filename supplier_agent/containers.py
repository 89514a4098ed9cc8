"""Renters' containers on this host, through the Docker SDK (never a shell, never the CLI).

One container per lease, named ``cloudgpu-<lease_id>`` and labelled with the claiming agent,
the lease, its declared ports and its GPUs, so that a restarted agent rebuilds its view from
Docker alone. Every call blocks; the agent runs them in ``asyncio.to_thread``.

This module makes the Docker calls: pull, create, start, wait until ready, warm up, list, stop
and remove, and the isolating bridge network. What it asks Docker for is decided elsewhere:
the hardened create options in container_spec.py, the image a rental runs in
container_images.py, the names and labels in container_names.py (all importable from here as
before).
"""

from __future__ import annotations

import collections
import contextlib
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
from docker.types import Mount

from supplier_agent import image_policy, protocol
from supplier_agent.container_events import ExitCallback, ExitWatcher, close_stream
from supplier_agent.container_images import DOCKER_HUB_NAMES as DOCKER_HUB_NAMES
from supplier_agent.container_images import (
    ObtainedImage,
    not_found_message,
    pull_refusal,
    registry_digest,
)
from supplier_agent.container_names import LABEL_CACHE as LABEL_CACHE
from supplier_agent.container_names import LABEL_CLAIM as LABEL_CLAIM
from supplier_agent.container_names import (
    LABEL_GPUS,
    LABEL_IMAGE_DIGEST,
    LABEL_NETWORK,
    LABEL_PORTS,
    LEGACY_SHARED_CACHE_PREFIX,
)
from supplier_agent.container_names import LABEL_LEASE as LABEL_LEASE
from supplier_agent.container_names import LABEL_VOLUME as LABEL_VOLUME
from supplier_agent.container_names import LABEL_VOLUME_CAP as LABEL_VOLUME_CAP
from supplier_agent.container_names import cache_volume_name as cache_volume_name
from supplier_agent.container_names import renter_volume_name as renter_volume_name
from supplier_agent.container_spec import CONTAINER_LOG_MIB, create_options, spec_refusal
from supplier_agent.container_spec import LOG_DRIVER as LOG_DRIVER
from supplier_agent.container_spec import LOG_FILES as LOG_FILES
from supplier_agent.container_spec import RENTAL_CAPS as RENTAL_CAPS
from supplier_agent.container_spec import container_log_config as container_log_config
from supplier_agent.disk_guard import DEFAULT_ALLOWANCE_BYTES, LABEL_ALLOWANCE
from supplier_agent.egress import EgressError, EgressPolicy
from supplier_agent.limits import HostResources, Reserve, lease_limits
from supplier_agent.protocol import DockerRun
from supplier_agent.toolkit import toolkit_refusal, toolkit_version

log = logging.getLogger(__name__)

# Every lease's container sits on this bridge, which drops traffic between its containers:
# Docker's default bridge lets one tenant reach another's ports directly.
NETWORK = "cloudgpu"
NETWORK_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}
# Docker before 25 lets concurrent creates make several networks of one name: one at a time here.
_network_lock = threading.Lock()
LOG_TAIL_LINES = 50
LOG_TAIL_CHARS = 8000  # fits ContainerExited.log_tail and keeps an ack's error readable
PORT_BIND_TIMEOUT_S = 30.0
PULL_LOG_EVERY_S = 5.0
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
class ClaimedContainer:
    lease_id: str
    container_id: str
    agent_id: str
    status: str  # Docker's: created, running, exited, dead, ...
    gpu_indices: tuple[int, ...] = ()
    ports: dict[int, int] = field(default_factory=dict)


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
        refusal = spec_refusal(spec, gpu_indices, gpus_required=self.gpu_devices == "nvidia")
        if refusal is not None:
            raise ContainerError(refusal)

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
        return create_options(
            spec,
            gpu_indices,
            agent_id=agent_id,
            gpu_uuids=gpu_uuids,
            gpu_devices=self.gpu_devices,
            mounts=mounts,
            limits=lease_limits(self.host, len(gpu_indices), self.host_gpus, self.reserve),
            shm_size=self.shm_size,
            pids_limit=self.pids_limit,
            log_max_bytes=self.log_max_bytes,
        )

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
    return ContainerError(pull_refusal(ref, detail))


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
