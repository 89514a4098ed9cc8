"""What a rental's container may use on the supplier's host (its GPUs' share of memory and
CPUs, a pids limit, no core dumps) and which NVIDIA toolkit may host GPU rentals at all, against
the real Docker engine with the local busybox image."""

from __future__ import annotations

import os
from typing import Any

import pytest

from supplier_agent.containers import ContainerError, ContainerRuntime
from supplier_agent.limits import HostResources, Reserve, nofile_limit
from tests.support.container_specs import SpecFactory, lease_containers
from tests.support.polling import wait_for

pytestmark = pytest.mark.docker


def test_a_lease_is_limited_to_its_gpus_share_of_memory_and_cpus(
    docker_client: Any, make_spec: SpecFactory, agent_id: str
) -> None:
    gib = 1024**3
    cpus = HostResources.read().cpus
    limited = ContainerRuntime(
        docker_client,
        gpu_devices="none",
        host_gpus=4,
        # Docker refuses a CPU limit above the CPUs it has: this machine's count, memory made up.
        host=HostResources(memory_bytes=64 * gib, cpus=cpus),
        reserve=Reserve(memory_bytes=8 * gib, cpus=0.0),
        allow_local_images=True,
    )

    container_id = limited.create(make_spec(), [0, 1], agent_id=agent_id)

    config = docker_client.api.inspect_container(container_id)["HostConfig"]
    assert config["Memory"] == 28 * gib  # (64 - 8) * 2/4
    assert config["MemorySwap"] == 28 * gib  # no swap on top
    assert config["NanoCpus"] == int(max(0.5, cpus * 2 / 4) * 1e9)
    assert {u["Name"]: (u["Soft"], u["Hard"]) for u in config["Ulimits"]} == {
        "nofile": (nofile_limit(), nofile_limit()),
        "core": (0, 0),
    }


def test_a_memory_bomb_is_oom_killed_inside_its_limit(
    docker_client: Any, make_spec: SpecFactory, agent_id: str
) -> None:
    # 512 MiB for the lease (the floor); the bomb asks for 800 MiB.
    small = ContainerRuntime(
        docker_client,
        gpu_devices="none",
        stop_grace_s=1,
        host_gpus=8,
        host=HostResources(memory_bytes=1024**3, cpus=2.0),
        reserve=Reserve(memory_bytes=0, cpus=0.0),
        allow_local_images=True,
    )
    bomb = ("dd", "if=/dev/zero", "of=/dev/null", "bs=800M", "count=1")
    result = small.run(make_spec(ports=(), command=bomb), [0], agent_id=agent_id)

    code, _, oom_killed = wait_for(
        lambda: small.exit_info(result.container_id), timeout_s=60, what="the bomb to end"
    )

    assert (code, oom_killed) == (137, True)


def test_a_fork_bomb_stops_at_the_pids_limit(
    docker_client: Any, make_spec: SpecFactory, agent_id: str
) -> None:
    few = ContainerRuntime(
        docker_client, gpu_devices="none", stop_grace_s=1, pids_limit=40, allow_local_images=True
    )
    # 200 sleepers wanted: the kernel refuses the fork past the limit (and the shell gives up).
    bomb = "sleep 1; i=0; while [ $i -lt 200 ]; do sleep 600 & i=$((i+1)); done; sleep 600"
    result = few.run(make_spec(ports=(), command=("sh", "-c", bomb)), [0], agent_id=agent_id)
    container = docker_client.containers.get(result.container_id)

    wait_for(lambda: b"can't fork" in container.logs(), timeout_s=60, what="a refused fork")

    assert docker_client.api.inspect_container(result.container_id)["HostConfig"]["PidsLimit"] == 40


def _toolkit_on_path(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    # The NVIDIA toolkit's own CLI is part of the GPU stack this machine lacks: a stand-in that
    # answers `--version` as the real one does.
    tool = tmp_path / "nvidia-ctk"
    tool.write_text(f"#!/bin/sh\necho 'NVIDIA Container Toolkit CLI version {version}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")


def test_a_toolkit_with_the_container_escape_takes_no_gpu_rentals(
    docker_client: Any,
    make_spec: SpecFactory,
    agent_id: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _toolkit_on_path(tmp_path, monkeypatch, "1.17.7")
    spec = make_spec()

    with pytest.raises(ContainerError, match=r"1\.17\.7, older than 1\.17\.8(?s:.*)CVE-2025-23266"):
        ContainerRuntime(docker_client, gpu_devices="nvidia", allow_local_images=True).run(
            spec, [0], agent_id=agent_id
        )
    assert lease_containers(docker_client, spec.lease_id) == []

    # The supplier who accepts the risk gets as far as Docker (which has no NVIDIA runtime here).
    accepted = ContainerRuntime(
        docker_client, gpu_devices="nvidia", toolkit_risk_accepted=True, allow_local_images=True
    )
    with pytest.raises(ContainerError, match="cannot give containers GPUs"):
        accepted.run(spec, [0], agent_id=agent_id)


def test_a_fixed_toolkit_is_no_obstacle(
    docker_client: Any,
    make_spec: SpecFactory,
    agent_id: str,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _toolkit_on_path(tmp_path, monkeypatch, "1.17.8")

    with pytest.raises(ContainerError) as refused:
        ContainerRuntime(docker_client, gpu_devices="nvidia", allow_local_images=True).run(
            make_spec(), [0], agent_id=agent_id
        )

    assert "CVE-2025-23266" not in str(refused.value)  # only Docker's lack of GPUs stops it
