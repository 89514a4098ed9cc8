from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from supplier_agent import release_signing
from tests.support.agents import AGENT, agent_env, configure, new_token
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.hub_peer import HubPeer

pytestmark = pytest.mark.docker


def _doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, "doctor", *args], capture_output=True, text=True, env=env, timeout=120, check=False
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
    assert result.returncode == 0  # a report, not a health bit
    assert "row(s) fail: see their fixes above" in result.stdout
    ssh = _row(result.stdout, "ssh")
    assert ssh.split()[1] == "fail"
    assert "apt install openssh-client" in ssh


def test_a_gpu_that_containers_cannot_reach_fails_with_the_fix(
    tmp_path: Path, docker_client: object
) -> None:
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)
    result = _doctor(agent_env(**fake_nvml_env(table.path)))
    assert result.returncode == 0, result.stdout + result.stderr
    gpu = _row(result.stdout, "gpu")
    assert gpu.split()[1] == "fail"
    assert "nvidia-container-toolkit" in gpu
    assert "570.86.15" in _row(result.stdout, "nvidia driver")


def test_the_full_report_shows_cuda_s_driver_api_and_whether_nccl_is_there(
    tmp_path: Path, docker_client: object
) -> None:
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=1)  # driver API 12080
    result = _doctor(agent_env(**fake_nvml_env(table.path)))
    assert _row(result.stdout, "cuda").split()[1:3] == ["ok", "driver"]
    assert "driver API 12.8" in _row(result.stdout, "cuda")
    assert _row(result.stdout, "nccl").split()[1] == "n/a"  # no libnccl on this machine


def test_the_nccl_row_names_the_version_the_library_reports(
    tmp_path: Path, docker_client: object
) -> None:
    # NVIDIA's library is not on the test machine: a stand-in with its one entry point.
    if shutil.which("cc") is None:
        pytest.fail("a C compiler is needed to build the stand-in libnccl (apt install gcc)")
    source = tmp_path / "nccl.c"
    source.write_text("int ncclGetVersion(int *version) { *version = 22105; return 0; }\n")
    libs = tmp_path / "lib"
    libs.mkdir()
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(libs / "libnccl.so.2"), str(source)], check=True
    )
    env = agent_env(LD_LIBRARY_PATH=str(libs), **fake_nvml_env(tmp_path / "no-such-table.json"))
    nccl = _row(_doctor(env).stdout, "nccl")
    assert nccl.split()[1:3] == ["ok", "2.21.5"]


def _configured(tmp_path: Path, url: str, token: str) -> Path:
    state = tmp_path / "state"
    assert configure(state, url, token, "--runtime", "mock").returncode == 0
    return state


def test_connectivity_skips_gpu_rows_and_exits_0_after_a_handshake(
    tmp_path: Path, docker_client: object
) -> None:
    token = new_token()
    with HubPeer(token) as hub:
        state = _configured(tmp_path, hub.url, token)
        result = _doctor(agent_env(), "--connectivity", "--state", str(state))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _row(result.stdout, "hub").split()[1] == "ok"
    names = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    assert not names & {"gpu", "cuda", "nccl", "nvidia"}, result.stdout


def test_connectivity_exits_4_when_the_token_is_rejected(
    tmp_path: Path, docker_client: object
) -> None:
    with HubPeer(new_token()) as hub:
        state = _configured(tmp_path, hub.url, new_token())
        result = _doctor(agent_env(), "--connectivity", "--state", str(state))
    assert result.returncode == 4, result.stdout + result.stderr
    assert "token rejected" in _row(result.stdout, "hub")


def test_connectivity_exits_3_when_the_hub_does_not_answer_in_10_s(
    tmp_path: Path, docker_client: object
) -> None:
    token = new_token()
    with HubPeer(token, behaviour="silent") as hub:
        state = _configured(tmp_path, hub.url, token)
        result = _doctor(agent_env(), "--connectivity", "--state", str(state))
    assert result.returncode == 3, result.stdout + result.stderr
    assert "no answer in 10 s" in _row(result.stdout, "hub")


def test_doctor_says_whether_docker_remaps_user_namespaces(
    tmp_path: Path, docker_client: Any
) -> None:
    """Issue 33 item 5: read against what this engine itself reports."""
    env = agent_env(**fake_nvml_env(tmp_path / "no-such-table.json"))
    row = _row(_doctor(env).stdout, "userns")
    remapped = any(o.startswith("name=userns") for o in docker_client.info()["SecurityOptions"])
    assert row.split()[1] == ("ok" if remapped else "warn"), row
    if not remapped:
        assert '"userns-remap": "default"' in row  # how to turn it on


def test_doctor_says_which_images_renters_may_run(tmp_path: Path, docker_client: Any) -> None:
    """Issue 33 item 2: the supplier's opt-in to renting their own images shows as a warning."""
    env = agent_env(**fake_nvml_env(tmp_path / "no-such-table.json"))
    state = tmp_path / "agent"
    assert (
        configure(state, "https://hub.example.com", new_token(), "--runtime", "mock").returncode
        == 0
    )
    row = _row(_doctor(env, "--state", str(state)).stdout, "images")
    assert row.split()[1] == "ok"
    assert "public registries" in row

    opted = tmp_path / "opted"
    assert (
        configure(
            opted,
            "https://hub.example.com",
            new_token(),
            "--runtime",
            "mock",
            "--allow-local-images",
        ).returncode
        == 0
    )
    row = _row(_doctor(env, "--state", str(opted)).stdout, "images")
    assert row.split()[1] == "warn"
    assert "private ones included" in row


def test_doctor_says_whether_upgrades_check_who_signed_a_release(
    tmp_path: Path, docker_client: Any
) -> None:
    env = agent_env(**fake_nvml_env(tmp_path / "no-such-table.json"))
    state = tmp_path / "agent"
    hub, token = "https://hub.example.com", new_token()
    assert configure(state, hub, token, "--runtime", "mock").returncode == 0
    row = _row(_doctor(env, "--state", str(state)).stdout, "releases")
    assert row.split()[1] == "warn"
    assert "no release key pinned" in row

    key = release_signing.public_key_text(Ed25519PrivateKey.generate().public_key())
    assert configure(state, hub, token, "--runtime", "mock", "--release-key", key).returncode == 0
    row = _row(_doctor(env, "--state", str(state)).stdout, "releases")
    assert row.split()[1] == "ok"
    assert f"signed by {release_signing.key_id(key)}" in row


def test_doctor_says_how_rentals_disk_use_is_bounded(tmp_path: Path, docker_client: Any) -> None:
    """Issue 33 item 1: a hard cap where Docker can set one, the agent's measuring elsewhere."""
    env = agent_env(**fake_nvml_env(tmp_path / "no-such-table.json"))
    row = _row(_doctor(env).stdout, "disk limits")
    info = docker_client.info()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem")
    assert row.removeprefix("disk limits").split()[0] == "ok", row
    assert f"{info['Driver']} on {backing}" in row
    assert "stops it within 1 GiB past its allowance" in row


def test_the_mount_options_of_a_path_are_those_of_its_deepest_mount(tmp_path: Path) -> None:
    from supplier_agent.doctor import _mount_options

    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw,relatime 0 0\n"
        "/dev/vdb /var/lib/docker xfs rw,relatime,prjquota 0 0\n"
        "/dev/vdc /var/lib/dockerish xfs rw 0 0\n"
    )
    assert "prjquota" in _mount_options("/var/lib/docker", str(mounts))
    assert "prjquota" in _mount_options("/var/lib/docker/overlay2", str(mounts))
    assert _mount_options("/var/lib/dockerish/x", str(mounts)) == "rw"
    assert _mount_options("/srv", str(mounts)) == "rw,relatime"
