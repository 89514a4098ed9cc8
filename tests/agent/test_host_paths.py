"""What a renter reads about a failed start carries no host paths (issue 33): Docker's, runc's
and containerd's own messages with the supplier's paths taken out and their meaning kept, and
the agent's acks of failed commands sent that way while its log keeps the whole text."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from supplier_agent.agent import Agent
from supplier_agent.config import AgentConfig
from supplier_agent.host_paths import PLACEHOLDER, redact_host_paths
from supplier_agent.mock_runtime import MockRuntime
from supplier_agent.protocol import DockerRun, RenterVolume
from supplier_agent.runtime import CommandFailed, RunOutcome
from supplier_agent.state import AgentState, Claim

LAYER = "3f1c0a9d" * 8  # 64 hex digits, as Docker names layers and containers
VOLUME_DATA = "/var/lib/docker/volumes/cloudgpu-vol-" + "a" * 40 + "/_data"
# runc 1.1+ through dockerd, a renter volume mounted at /proc.
RUNC_PROC = (
    "failed to create task for container: failed to create shim task: OCI runtime create "
    "failed: runc create failed: unable to start container process: error during container "
    f'init: error mounting "{VOLUME_DATA}" to rootfs at "/proc": mount {VOLUME_DATA}:/proc '
    "(via /proc/self/fd/7), flags: 0x5000: operation not permitted: unknown"
)
# runc 1.0 rc (escaped quotes, the rootfs as a host path).
RUNC_OLD = (
    "OCI runtime create failed: container_linux.go:349: starting container process caused "
    '"process_linux.go:449: container init caused \\"rootfs_linux.go:58: mounting '
    f'\\\\\\"{VOLUME_DATA}\\\\\\" to rootfs \\\\\\"/var/lib/docker/overlay2/{LAYER}/merged'
    f'\\\\\\" at \\\\\\"/var/lib/docker/overlay2/{LAYER}/merged/proc\\\\\\" caused '
    '\\\\\\"permission denied\\\\\\"\\"": unknown'
)
OVERLAY = (
    f"error creating overlay mount to /var/lib/docker/overlay2/{LAYER}/merged: invalid "
    'argument; mount options: "index=off,lowerdir=/var/lib/docker/overlay2/l/Q2ZP5:'
    f"/var/lib/docker/overlay2/l/7XKJD,upperdir=/var/lib/docker/overlay2/{LAYER}/diff,"
    f'workdir=/var/lib/docker/overlay2/{LAYER}/work"'
)
SHIM = (
    "failed to create shim task: OCI runtime create failed: open "
    f"/run/containerd/io.containerd.runtime.v2.task/moby/{LAYER}/log.json: no such file or "
    f"directory; cgroup /sys/fs/cgroup/system.slice/docker-{LAYER}.scope: device or resource busy"
)
HOST_MARKS = ("/var/lib/docker", "/run/containerd", "/sys/fs/cgroup", "/proc/self", LAYER)


def _has_no_host_path(text: str) -> bool:
    return not any(mark in text for mark in HOST_MARKS) and "overlay2" not in text


def test_runc_s_error_for_a_volume_at_proc_keeps_what_the_renter_chose() -> None:
    redacted = redact_host_paths(RUNC_PROC)
    assert _has_no_host_path(redacted)
    assert redacted == (
        "failed to create task for container: failed to create shim task: OCI runtime create "
        "failed: runc create failed: unable to start container process: error during container "
        'init: error mounting "<host path>" to rootfs at "/proc": mount <host path>:/proc '
        "(via <host path>), flags: 0x5000: operation not permitted: unknown"
    )


def test_an_older_runc_s_escaped_message_loses_its_host_paths() -> None:
    redacted = redact_host_paths(RUNC_OLD)
    assert _has_no_host_path(redacted)
    assert "mounting" in redacted
    assert "permission denied" in redacted
    assert redacted.count(PLACEHOLDER) == 3


def test_an_overlay_mount_error_loses_its_layer_list() -> None:
    redacted = redact_host_paths(OVERLAY)
    assert _has_no_host_path(redacted)
    assert "Q2ZP5" not in redacted
    assert redacted == (
        "error creating overlay mount to <host path>: invalid argument; mount options: "
        '"index=off,lowerdir=<host path>,upperdir=<host path>,workdir=<host path>"'
    )


def test_containerd_s_task_folder_and_the_container_s_cgroup_go() -> None:
    redacted = redact_host_paths(SHIM)
    assert _has_no_host_path(redacted)
    assert "no such file or directory" in redacted
    assert "device or resource busy" in redacted


def test_a_path_the_renter_named_in_the_container_stays() -> None:
    # /tmp is the host's in most messages, but here runc names the image's own command.
    error = (
        'runc create failed: unable to start container process: exec: "/tmp/run.sh": stat '
        "/tmp/run.sh: no such file or directory: unknown"
    )
    assert redact_host_paths(error) == error
    assert redact_host_paths("open /tmp/cloudgpu-1234/spec.json: denied") == (
        "open <host path>: denied"
    )
    chosen = "mounting over /tmp/scratch failed"
    assert redact_host_paths(chosen, keep=["/tmp/scratch"]) == chosen


def test_the_agent_s_state_folder_goes_wherever_it_is() -> None:
    state = "/home/gpu owner/.local/state/cloudgpu-agent"
    redacted = redact_host_paths(f"open {state}/claims.json: no space left", host_folders=[state])
    assert redacted == "open <host path>: no space left"
    # A relative folder is no folder of the host: it would take a word out of every sentence.
    assert redact_host_paths("bad state here", host_folders=["state"]) == "bad state here"


def test_a_docker_data_root_elsewhere_is_known_by_its_layers_and_volumes() -> None:
    error = f'error mounting "/srv/docker/volumes/x/_data" to rootfs at "/data": /srv/d/{LAYER}'
    assert redact_host_paths(error) == (
        'error mounting "<host path>" to rootfs at "/data": <host path>'
    )


@pytest.mark.parametrize(
    "text",
    [
        "image cloudgpu-test/nope:latest not found",
        "pull access denied for ghcr.io/org/x, repository does not exist",
        f"manifest for busybox@sha256:{LAYER} not found",
        "GPU 0 is locked by another platform (pid 4711)",
        "stale epoch 1: GPU already granted under epoch 2",
        "open /proc/driver/nvidia/gpus: no such file",
        "https://registry-1.docker.io/v2/library/busybox/manifests/latest: 429 Too Many Requests",
        "",
    ],
)
def test_messages_without_host_paths_are_left_as_they_are(text: str) -> None:
    assert redact_host_paths(text) == text


def test_a_long_text_is_redacted_in_linear_time() -> None:
    # A failed warm-up's output can be long; no quadratic pattern runs over it.
    text = "x" * 200_000 + " /var/lib/docker/y"
    assert redact_host_paths(text).endswith(f" {PLACEHOLDER}")


# --- the agent --------------------------------------------------------------------------------


class _FailingRuntime(MockRuntime):
    """Starts nothing: dockerd's answer to a volume at /proc, as the Docker runtime raises it."""

    def __init__(self, agent_id: str, error: Exception) -> None:
        super().__init__(agent_id)
        self.error = error

    async def start(self, command: DockerRun, claim: Claim, **_: object) -> RunOutcome:
        raise self.error


@pytest.mark.parametrize("kind", [CommandFailed, RuntimeError])
async def test_the_agent_acks_a_failed_start_without_host_paths_and_logs_it_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: type[Exception]
) -> None:
    state = AgentState(tmp_path / "state")
    error = f"{RUNC_PROC}; open {tmp_path}/state/claims.json: read-only file system"
    config = AgentConfig(hub_url="ws://127.0.0.1:1/", token="t", state_dir=state.dir)
    agent = Agent(config, _FailingRuntime(state.agent_id, kind(error)), state)
    lease = str(uuid.uuid4())
    # Reserved already (a reserve here would also make the lease's tunnel key).
    state.save_claim(Claim(lease_id=lease, gpu_indices=[0], epoch=1))
    run = DockerRun(
        command_id=str(uuid.uuid4()),
        lease_id=lease,
        epoch=1,
        image="busybox:latest",
        volumes=(RenterVolume("vol-" + "a" * 40, "/tmp/scratch"),),
    )

    with caplog.at_level(logging.WARNING, logger="cloudgpu.agent"):
        ack = await agent.execute(run)

    assert not ack.ok
    assert ack.error is not None
    assert _has_no_host_path(ack.error)
    assert str(tmp_path) not in ack.error
    assert 'to rootfs at "/proc"' in ack.error
    assert "read-only file system" in ack.error
    # The supplier's log keeps Docker's whole text, once (an unexpected error with its trace).
    assert caplog.text.count(error) == 1
