"""``cloudgpu-agent doctor``: what this host can offer, and what to fix.

Rows: host, Docker, NVIDIA driver, container toolkit (warn below 1.17.8, CVE-2025-23266), GPU,
CUDA (the driver API version NVML reports), NCCL (whether the host has libnccl), the OpenSSH
client that renters' tunnels need, Docker's disk (warn below the disk floor), whether Docker
can cap rentals' writable layers (else the disk guard alone bounds them), the rentals' packet
filter, whether Docker remaps user namespaces (warn when not), and which images renters
may run (warn with ``allow_local_images``).
The GPU row is ``n/a`` on a CPU-only box (not a failure), ``ok`` when NVML works and (if the
probe image is already local) a ``--gpus all`` container sees the GPU, ``fail`` when the host
has a GPU that containers cannot get. The probe never pulls an image.

The full report is text to read: it exits 0 once printed, whatever its rows say (seed 003: not
a hardware health bit). ``--connectivity`` skips the GPU, CUDA and NCCL rows, tries one
handshake with the hub (10 s budget) and exits as ``smoke`` does: 0, 3, 4 or 1.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from supplier_agent import __version__
from supplier_agent.hostinfo import read_host_info
from supplier_agent.toolkit import RISK_FLAG, SAFE_TOOLKIT, toolkit_version

PROBE_IMAGE = os.environ.get("CLOUDGPU_PROBE_IMAGE", "nvidia/cuda:12.4.1-base-ubuntu22.04")
TOOLKIT_FIX = "install nvidia-container-toolkit and run `nvidia-ctk runtime configure` for Docker"


@dataclass(frozen=True)
class Row:
    name: str
    status: str  # ok | warn | fail | n/a
    detail: str


def _docker_row() -> tuple[Row, object | None]:
    try:
        import docker
        from docker.errors import DockerException

        client = docker.from_env(timeout=10)
        version = client.version().get("Version", "?")
    except DockerException as exc:
        return Row("docker", "fail", f"engine unreachable: {exc}"), None
    return Row("docker", "ok", f"engine {version}"), client


def _toolkit_row() -> Row:
    version = toolkit_version()
    if version is None:
        return Row("container toolkit", "warn", f"not found; {TOOLKIT_FIX}")
    text = ".".join(map(str, version))
    if version < SAFE_TOOLKIT:
        return Row(
            "container toolkit",
            "warn",
            f"{text} is older than 1.17.8 (CVE-2025-23266, container escape): upgrade it; "
            f"until then the agent takes no GPU rentals (unless configured {RISK_FLAG})",
        )
    return Row("container toolkit", "ok", text)


def _ssh_row() -> Row:
    # Both come with openssh-client: ssh-keygen makes each lease's key, ssh opens its tunnel.
    missing = [tool for tool in ("ssh", "ssh-keygen") if shutil.which(tool) is None]
    if missing:
        return Row(
            "ssh",
            "fail",
            f"{' and '.join(missing)} not found: renters could not reach their containers; "
            "apt install openssh-client",
        )
    try:
        banner = subprocess.run(
            ["ssh", "-V"], capture_output=True, text=True, timeout=10, check=False
        ).stderr.strip()
    except (OSError, subprocess.TimeoutExpired):
        banner = ""
    return Row("ssh", "ok", banner.split(",")[0] or "found")


def _gpu_rows(client: object | None) -> list[Row]:
    from supplier_agent.gpu import Nvml

    nvml = Nvml()
    try:
        gpus = nvml.gpus()
        driver = nvml.driver_version()
        cuda = nvml.cuda_version()
        reason = nvml.unavailable_reason
    finally:
        nvml.shutdown()
    driver_row = Row("nvidia driver", "ok" if driver else "n/a", driver or (reason or "not found"))
    # Images bring their own CUDA runtime; what the host decides is the newest it can run.
    cuda_row = Row(
        "cuda",
        "ok" if cuda else "n/a",
        f"driver API {cuda}: images built for CUDA up to {cuda} run here"
        if cuda
        else "no NVIDIA driver: no CUDA",
    )
    rows = [driver_row, cuda_row, _nccl_row()]
    if not gpus:
        return [
            *rows,
            Row("gpu", "n/a", "no NVIDIA GPU found (a CPU-only host can still run the agent)"),
        ]
    names = ", ".join(f"{g.index}: {g.name}" for g in gpus)
    if client is None:
        return [*rows, Row("gpu", "fail", f"{names}; Docker is unreachable")]
    from supplier_agent.containers import nvidia_runtime_available

    if not nvidia_runtime_available(client):
        return [
            *rows,
            Row("gpu", "fail", f"{names}; containers cannot get GPUs: {TOOLKIT_FIX}"),
        ]
    return [*rows, _probe(client, names)]


def _nccl_row() -> Row:
    """Whether the host's loader finds NCCL (multi-GPU rentals' images usually bring their own,
    so absence is not a failure) and which version it says it is."""
    try:
        library = ctypes.CDLL("libnccl.so.2")
    except OSError:
        return Row("nccl", "n/a", "libnccl.so.2 not on this host (images bring their own)")
    code = ctypes.c_int(0)
    try:
        result = library.ncclGetVersion(ctypes.byref(code))
    except AttributeError:
        return Row("nccl", "warn", "libnccl.so.2 found but has no ncclGetVersion")
    if result != 0:
        return Row("nccl", "warn", f"libnccl.so.2 found; ncclGetVersion failed ({result})")
    # NCCL_VERSION_CODE: major*10000 + minor*100 + patch since 2.9 (major*1000 before).
    value = code.value
    major, rest = (
        (value // 10000, value % 10000) if value >= 20900 else (value // 1000, value % 1000)
    )
    return Row("nccl", "ok", f"{major}.{rest // 100}.{rest % 100} (libnccl.so.2)")


def _probe(client: object, names: str) -> Row:
    from docker.errors import DockerException, ImageNotFound
    from docker.types import DeviceRequest

    try:
        client.images.get(PROBE_IMAGE)  # type: ignore[attr-defined]
    except ImageNotFound:
        return Row("gpu", "ok", f"{names} (container probe skipped: {PROBE_IMAGE} is not local)")
    except DockerException as exc:
        return Row("gpu", "fail", f"{names}; Docker error: {exc}")
    try:
        output = client.containers.run(  # type: ignore[attr-defined]
            PROBE_IMAGE,
            ["nvidia-smi", "-L"],
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])],
            remove=True,
        )
    except DockerException as exc:
        return Row("gpu", "fail", f"{names}; a --gpus all container failed: {exc}; {TOOLKIT_FIX}")
    seen = output.decode(errors="replace").count("GPU ")
    return Row(
        "gpu", "ok" if seen else "fail", f"{names}; a --gpus all container sees {seen} GPU(s)"
    )


def _docker_disk_row(client: object | None, state: str | None) -> Row:
    """Free space where Docker keeps images, volumes and container logs."""
    from supplier_agent.config import AgentConfig, ConfigError, load

    if client is None:
        return Row("docker disk", "fail", "Docker is unreachable: its disk cannot be checked")
    floor_gib, log_mib = AgentConfig.disk_floor_gib, AgentConfig.container_log_mib
    try:
        config = load({"state": state})
        floor_gib, log_mib = config.disk_floor_gib, config.container_log_mib
    except ConfigError:
        pass  # not configured yet: the defaults
    root = client.info().get("DockerRootDir") or "/var/lib/docker"  # type: ignore[attr-defined]
    try:
        stats = os.statvfs(root)
    except OSError as exc:
        return Row("docker disk", "warn", f"cannot measure {root}: {exc}")
    free_gib = stats.f_bavail * stats.f_frsize / 1024**3
    total_gib = stats.f_blocks * stats.f_frsize / 1024**3
    detail = (
        f"{free_gib:.1f} GiB free of {total_gib:.1f} GiB at {root}; "
        f"each lease's logs are kept to {log_mib:g} MiB"
    )
    if free_gib < floor_gib:
        # Images, volumes and logs share it: a full disk fails pulls and stops containers.
        return Row(
            "docker disk",
            "warn",
            f"{detail}; below the floor of {floor_gib:g} GiB: unused volumes are being removed, "
            "free space (docker image prune, larger disk) before rentals fail",
        )
    return Row("docker disk", "ok", detail)


def _egress_row(client: object | None, state: str | None) -> Row:
    """Whether the packet filter between rentals and this host's network is in place."""
    from supplier_agent.config import ConfigError, load
    from supplier_agent.containers import NETWORK, bridge_interface
    from supplier_agent.egress import EgressPolicy

    if client is None:
        return Row("egress", "fail", "Docker is unreachable: the rental network cannot be checked")
    if os.geteuid() != 0:
        return Row("egress", "warn", "run doctor as root to check the rental network filter")
    try:
        allowed = load({"state": state}).allow_networks
    except ConfigError:
        allowed = ()  # not configured yet: the default policy
    policy = EgressPolicy(allowed)
    networks = [
        n
        for n in client.api.networks(names=[NETWORK])  # type: ignore[attr-defined]
        if n.get("Name") == NETWORK
    ]
    if not networks:
        if shutil.which("iptables") is None:
            return Row("egress", "fail", "iptables not found: apt install iptables")
        return Row("egress", "ok", "the rentals' network filter is installed with the first rental")
    gaps = [gap for n in networks for gap in policy.missing(bridge_interface(n))]
    if gaps and "iptables is not installed" in gaps[0]:
        return Row("egress", "fail", gaps[0])
    if gaps:
        # Not a failure by itself: the agent installs them when it starts and before every
        # rental, and refuses rentals when it cannot.
        return Row(
            "egress",
            "warn",
            f"{len(gaps)} rule(s) not in place, e.g. {gaps[0]}; the agent installs them when "
            "it starts and before each rental: if it is running, check what removes them",
        )
    extra = f"; also allowed: {', '.join(allowed)}" if allowed else ""
    return Row(
        "egress",
        "ok",
        "rentals reach the internet and DNS, not this host, its LAN or link-local" + extra,
    )


def _mount_options(path: str, mounts: str = "/proc/self/mounts") -> str:
    """The options of the filesystem mounted at or above ``path`` (the longest match)."""
    best, options = "", ""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) < 4:
            continue
        point = fields[1]
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, options = point, fields[3]
    return options


def _disk_limit_row(client: object | None) -> Row:
    """Whether Docker can cap a container's writable layer (``--storage-opt size=``)."""
    from supplier_agent.disk_guard import INTERVAL_S, MARGIN_BYTES

    if client is None:
        return Row("disk limits", "fail", "Docker is unreachable: its storage cannot be checked")
    info = client.info()  # type: ignore[attr-defined]
    driver = str(info.get("Driver") or "?")
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "?")
    root = str(info.get("DockerRootDir") or "/var/lib/docker")
    guard = (
        f"the agent measures each rental's disk use every {INTERVAL_S:.0f} s (sooner while the "
        f"disk falls) and stops it within {MARGIN_BYTES // 1024**3} GiB past its allowance"
    )
    options = _mount_options(root).split(",")
    if driver == "overlay2" and backing == "xfs" and {"pquota", "prjquota"} & set(options):
        return Row("disk limits", "ok", f"overlay2 on xfs with project quotas: writable layers "
                   f"are capped at the allowance by Docker; {guard}")  # fmt: skip
    return Row(
        "disk limits",
        "ok",
        f"{driver} on {backing}: Docker cannot cap writable layers here, so {guard} (for a hard "
        "cap, put Docker's data on xfs mounted with pquota)",
    )


def _userns_row(client: object | None) -> Row:
    """Whether Docker maps a container's root to an unprivileged user of this host."""
    if client is None:
        return Row("userns", "fail", "Docker is unreachable: its user namespaces cannot be checked")
    options = client.info().get("SecurityOptions") or []  # type: ignore[attr-defined]
    if any(str(option).startswith("name=userns") for option in options):
        return Row("userns", "ok", "Docker remaps containers' root to an unprivileged host user")
    # A warning, not a failure: rentals already run without most capabilities, with
    # no-new-privileges and the egress filter; remapping is the next wall behind them.
    return Row(
        "userns",
        "warn",
        "Docker does not remap user namespaces: a rental's root would be this host's root if "
        'it escaped its container; set "userns-remap": "default" in /etc/docker/daemon.json and '
        "restart Docker (images and volumes made before are not seen by remapped containers)",
    )


def _images_row(state: str | None) -> Row:
    """Which images renters may run here (containers.obtain_image)."""
    from supplier_agent.config import ConfigError, load

    try:
        local = load({"state": state}).allow_local_images
    except ConfigError:
        local = False
    if local:
        return Row(
            "images",
            "warn",
            "allow_local_images is on: renters may run any image on this host, your own "
            "private ones included, without a pull",
        )
    return Row("images", "ok", "rentals pull their image anonymously from public registries")


def _release_keys_row(state: str | None) -> Row:
    """Whether `upgrade` checks who signed a release (release_signing.py)."""
    from supplier_agent.config import ConfigError, load

    try:
        keys = load({"state": state}).release_keys
    except ConfigError as exc:
        return Row("releases", "warn", f"cannot read the pinned release keys: {exc}")
    if not keys:
        return Row(
            "releases",
            "warn",
            "no release key pinned: upgrades check the wheel's sha256 but not who signed it; "
            "pin the hub operator's key with configure --update --release-key KEY",
        )
    from supplier_agent.release_signing import key_id

    ids = ", ".join(key_id(k) for k in keys)
    return Row("releases", "ok", f"upgrades take only releases signed by {ids}")


def _connectivity_row(state: str | None) -> tuple[Row, int]:
    """The hub row and ``smoke``'s exit code for the same handshake."""
    from supplier_agent.config import ConfigError, load
    from supplier_agent.smoke import run_smoke

    try:
        config = load({"state": state})
    except ConfigError as exc:
        return Row("hub", "fail", str(exc)), 1
    code = run_smoke(config)
    meaning = {0: "handshake ok", 3: "no answer in 10 s", 4: "token rejected"}
    row = Row(
        "hub", "ok" if code == 0 else "fail", f"{config.ws_url}: {meaning.get(code, 'error')}"
    )
    return row, code


def run_doctor(state: str | None, *, connectivity: bool) -> int:
    """Print the report. The full one exits 0 (it is read, not tested); ``--connectivity``
    exits with ``smoke``'s code for its handshake."""
    host = read_host_info()
    rows = [
        Row("agent", "ok", __version__),
        Row(
            "host",
            "ok",
            f"{host.hostname}, {host.os}, {host.arch}, {host.cpu_count} CPU ({host.cpu_model}), "
            f"{host.ram_bytes / 1024**3:.1f} GiB RAM",
        ),
    ]
    docker_row, client = _docker_row()
    rows.append(docker_row)
    if not connectivity:
        rows.append(_toolkit_row())
        rows.extend(_gpu_rows(client))
    rows.append(_ssh_row())
    rows.append(_docker_disk_row(client, state))
    rows.append(_egress_row(client, state))
    rows.append(_disk_limit_row(client))
    rows.append(_userns_row(client))
    rows.append(_images_row(state))
    rows.append(_release_keys_row(state))
    if Path("/var/lock").is_dir() and not os.access("/var/lock", os.W_OK):
        rows.append(Row("locks", "warn", "/var/lock is not writable: run the agent as root"))
    code = 0
    if connectivity:
        hub_row, code = _connectivity_row(state)
        rows.append(hub_row)
    width = max(len(row.name) for row in rows)
    for row in rows:
        print(f"{row.name:<{width}}  {row.status:<4}  {row.detail}")
    if client is not None:
        client.close()  # type: ignore[attr-defined]
    failed = sum(row.status == "fail" for row in rows)
    if failed and not connectivity:
        print(f"\n{failed} row(s) fail: see their fixes above (the exit code stays 0)")
    return code
