from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.agents import AGENT, agent_env
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env

pytestmark = pytest.mark.docker


def _doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, "doctor"], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def _row(output: str, name: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(f"{name} "))


def test_a_cpu_only_host_is_not_a_failure(tmp_path: Path, docker_client: object) -> None:
    # The fake pynvml with no table behaves like a host without the NVIDIA driver.
    env = agent_env(**fake_nvml_env(tmp_path / "no-such-table.json"))
    result = _doctor(env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _row(result.stdout, "gpu").split()[1] == "n/a"
    assert _row(result.stdout, "docker").split()[1] == "ok"
    assert _row(result.stdout, "ssh").split()[1] == "ok"


def test_a_host_without_the_openssh_client_fails_with_the_fix(
    tmp_path: Path, docker_client: object
) -> None:
    no_tools = tmp_path / "bin"
    no_tools.mkdir()
    env = agent_env(PATH=str(no_tools), **fake_nvml_env(tmp_path / "no-such-table.json"))
    result = _doctor(env)
    assert result.returncode == 1
    ssh = _row(result.stdout, "ssh")
    assert ssh.split()[1] == "fail"
    assert "apt install openssh-client" in ssh


def test_a_gpu_that_containers_cannot_reach_fails_with_the_fix(
    tmp_path: Path, docker_client: object
) -> None:
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    result = _doctor(agent_env(**fake_nvml_env(table.path)))
    assert result.returncode == 1
    gpu = _row(result.stdout, "gpu")
    assert gpu.split()[1] == "fail"
    assert "nvidia-container-toolkit" in gpu
    assert "570.86.15" in _row(result.stdout, "nvidia driver")
