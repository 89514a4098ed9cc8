"""Which runtime `make run`'s demo agent gets (hub/runner.py): Docker with --gpu-devices none
where an engine answers and the hub runs as root (with one simulated GPU where NVML lists
none), else the mock runtime, saying why."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hub import runner


def _probe(monkeypatch: pytest.MonkeyPatch, found: dict[str, Any]) -> None:
    def fake_run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(found) + "\n", stderr="")

    monkeypatch.setattr(runner.subprocess, "run", fake_run)


def test_docker_with_a_gpu_runs_containers_without_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _probe(monkeypatch, {"docker": None, "gpus": 1})
    settings, line = runner.demo_agent_runtime({})
    assert settings == {
        "CLOUDGPU_RUNTIME": "docker",
        "CLOUDGPU_GPU_DEVICES": "none",
        "CLOUDGPU_COMPUTE_MODE": "skip",
        # No registry in the trial: it says it rents out this machine's own images.
        "CLOUDGPU_ALLOW_LOCAL_IMAGES": "1",
        "CLOUDGPU_DISK_FLOOR_GIB": "2",  # a trial machine's disk, not a supplier's
    }
    assert line.startswith("Docker runtime, --gpu-devices none; ")
    assert "allow_local_images" in line


@pytest.mark.parametrize(
    ("found", "why"),
    [
        ({"docker": "DockerException: no socket", "gpus": 1}, "no Docker engine reachable"),
        ({"docker": None, "gpus": 0}, "NVML lists no GPU"),  # no state folder to keep a table
    ],
)
def test_otherwise_the_mock_runtime_says_why(
    monkeypatch: pytest.MonkeyPatch, found: dict[str, Any], why: str
) -> None:
    _probe(monkeypatch, found)
    settings, line = runner.demo_agent_runtime({})
    assert settings == {"CLOUDGPU_RUNTIME": "mock"}
    assert line.startswith("mock runtime (")
    assert why in line


def test_the_real_probe_answers_on_this_machine() -> None:
    settings, line = runner.demo_agent_runtime({"PATH": "/usr/bin:/bin"})
    assert settings["CLOUDGPU_RUNTIME"] in {"docker", "mock"}
    assert "did not answer" not in line


def test_without_a_gpu_the_docker_runtime_rents_one_simulated_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if os.geteuid() != 0:
        pytest.skip("the demo's Docker runtime is chosen only as root")
    _probe(monkeypatch, {"docker": None, "gpus": 0})
    settings, line = runner.demo_agent_runtime({}, tmp_path)
    assert settings["CLOUDGPU_RUNTIME"] == "docker"
    assert settings["CLOUDGPU_GPU_DEVICES"] == "none"
    assert "simulated GPU" in line
    table = json.loads(Path(settings["CLOUDGPU_FAKE_NVML_TABLE"]).read_text())
    assert [gpu["name"] for gpu in table["gpus"]] == [runner.DEMO_GPU_NAME]
    assert settings["PYTHONPATH"].split(os.pathsep)[0] == str(runner.FAKE_NVML_DIR)
    # The same table on the next start: the host keeps its GPU's identity.
    again, _ = runner.demo_agent_runtime({}, tmp_path)
    assert again == settings
