"""What a rental's container is created with: the hardening every lease gets, in one place.

``create_options`` is the whole of what Docker is asked for when the runtime (containers.py)
creates a lease's container: every capability dropped but ``RENTAL_CAPS``, not privileged,
``no-new-privileges``, Docker's private PID and IPC namespaces, ports on 127.0.0.1 only, pids,
memory (= memory+swap) and CPU limits, no core dumps, the GPUs named explicitly, and the output
Docker keeps on the supplier's disk capped. ``spec_refusal`` checks a ``DockerRun`` again before
that, since one built in code never went through the protocol. No Docker calls here: the
runtime makes the network and volumes and passes them in; this decides the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from docker.types import DeviceRequest, LogConfig, Mount, Ulimit

from supplier_agent import protocol
from supplier_agent.container_names import LABEL_CLAIM, LABEL_GPUS, LABEL_LEASE, LABEL_PORTS
from supplier_agent.limits import LeaseLimits, nofile_limit
from supplier_agent.protocol import DockerRun, ProtocolError

# What Docker keeps of one lease's output on the supplier's disk. Its default (json-file, no
# limit) kept everything: one lease printing 64 KiB/s wrote 484 MB/h under /var/lib/docker.
# The `local` driver rotates through LOG_FILES files (compressing the older ones); the live
# follower and the exit tail (containers.py's last LOG_TAIL_LINES lines) read it as before. Set
# explicitly, so a daemon whose default driver cannot be read back (syslog) still has logs.
CONTAINER_LOG_MIB = 64
LOG_DRIVER = "local"
LOG_FILES = 4

# Every capability is dropped and only these come back: what ordinary images need as root in
# their own container (docs/suppliers.md, "What a rental can reach and use"). CHOWN,
# DAC_OVERRIDE and
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


def container_log_config(max_bytes: int) -> LogConfig:
    """Docker's log options for at most ``max_bytes`` of a container's output on disk."""
    per_file_kib = max(64, max_bytes // LOG_FILES // 1024)
    return LogConfig(
        type=LOG_DRIVER,
        config={"max-size": f"{per_file_kib}k", "max-file": str(LOG_FILES), "compress": "true"},
    )


def spec_refusal(spec: DockerRun, gpu_indices: Sequence[int], *, gpus_required: bool) -> str | None:
    """Why ``spec`` may not run on ``gpu_indices``, or None (``gpus_required``: the runtime
    attaches GPUs, so a lease without one is refused)."""
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
        return f"refusing to run lease {spec.lease_id}: {exc}"
    if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in gpu_indices):
        return f"GPU indices must be whole numbers, not {list(gpu_indices)}"
    if gpus_required and not gpu_indices:
        return f"lease {spec.lease_id} has no claimed GPU for its container"
    return None


def create_options(
    spec: DockerRun,
    gpu_indices: Sequence[int],
    *,
    agent_id: str,
    gpu_uuids: Sequence[str],
    gpu_devices: str,
    mounts: list[Mount],
    limits: LeaseLimits,
    shm_size: str,
    pids_limit: int,
    log_max_bytes: int,
) -> dict[str, Any]:
    """The keyword arguments of Docker's create for ``spec``'s container (its network, the
    pinned image and the disk allowance's labels are the runtime's to add).

    ``gpu_devices`` is the runtime's: "nvidia" attaches the claimed GPUs (by ``gpu_uuids``,
    same order, where known: indices can be renumbered by a driver reload, UUIDs cannot),
    "none" attaches none. ``mounts``: the lease's cache and volumes, made by the runtime.
    """
    devices = None
    # Set explicitly, over whatever the image says (CUDA images say "all"): where the NVIDIA
    # runtime is dockerd's default, that variable alone hands a container every GPU of the
    # host, other renters' included. "void" gives none.
    visible = "void"
    if gpu_devices == "nvidia":
        ids = list(gpu_uuids) if len(gpu_uuids) == len(gpu_indices) else []
        ids = ids or [str(i) for i in gpu_indices]
        devices = [DeviceRequest(driver="nvidia", device_ids=ids, capabilities=[["gpu"]])]
        visible = ",".join(ids)
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
        "shm_size": shm_size,
        "privileged": False,
        "security_opt": ["no-new-privileges:true"],
        "pids_limit": pids_limit,
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
        "log_config": container_log_config(log_max_bytes),
        "restart_policy": {"Name": "no"},
        "detach": True,
    }
