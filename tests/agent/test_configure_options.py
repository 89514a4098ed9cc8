"""`configure`: seed 003's `--driver` and `--connect-mode`, and its exit codes (0, 1 a value refused
or the file not written, 2 a usage error)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from supplier_agent import release_signing
from supplier_agent.config import read_file
from tests.support.agents import AGENT, agent_env, configure, new_token

HUB = "https://hub.example.com"


@pytest.mark.parametrize("driver", ["docker", "mock"])
def test_a_supported_driver_is_the_runtime_rentals_start_in(tmp_path: Path, driver: str) -> None:
    state = tmp_path / "state"
    result = configure(state, HUB, new_token(), "--driver", driver, "--connect-mode", "agent_dial")
    assert result.returncode == 0, result.stderr
    assert f"runtime = {driver}" in (state / "cloudgpu-agent.conf").read_text()


@pytest.mark.parametrize(
    ("driver", "why"),
    [
        ("nerdctl", "containerd through nerdctl is not supported"),
        ("udocker", "rootless udocker is not supported"),
        ("host", "host processes (macOS, Metal) are not supported"),
        ("podman", "unknown driver 'podman'"),
    ],
)
def test_an_unsupported_or_unknown_driver_leaves_deployments_off(
    tmp_path: Path, driver: str, why: str
) -> None:
    result = configure(tmp_path / "state", HUB, new_token(), "--driver", driver)
    assert result.returncode == 1
    assert why in result.stderr
    assert "deployments stay off rather than guess another driver" in result.stderr
    assert "drivers: docker, mock" in result.stderr
    assert not (tmp_path / "state" / "cloudgpu-agent.conf").exists()


def test_driver_and_runtime_that_disagree_are_a_usage_error(tmp_path: Path) -> None:
    result = configure(
        tmp_path / "state", HUB, new_token(), "--driver", "docker", "--runtime", "mock"
    )
    assert result.returncode == 2
    assert "disagree" in result.stderr


def test_server_dial_is_refused_with_the_reason(tmp_path: Path) -> None:
    result = configure(tmp_path / "state", HUB, new_token(), "--connect-mode", "server_dial")
    assert result.returncode == 1
    assert "the hub never dials suppliers" in result.stderr
    assert not (tmp_path / "state" / "cloudgpu-agent.conf").exists()


def test_an_unknown_connect_mode_is_a_usage_error(tmp_path: Path) -> None:
    result = configure(tmp_path / "state", HUB, new_token(), "--connect-mode", "carrier_pigeon")
    assert result.returncode == 2
    assert "agent_dial" in result.stderr


def test_a_config_that_cannot_be_written_exits_1_with_the_reason(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = configure(blocker / "state", HUB, new_token())
    assert result.returncode == 1
    assert f"cannot write the config in {blocker / 'state'}" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_hub_is_a_usage_error(tmp_path: Path) -> None:
    result = configure_without_hub(tmp_path / "state")
    assert result.returncode == 2
    assert "--hub" in result.stderr


def configure_without_hub(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, "configure", "--state", str(state)],
        input=new_token() + "\n",
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=60,
        check=False,
    )


def test_release_keys_are_checked_normalised_and_written(tmp_path: Path) -> None:
    """Issue 37: `--release-key` pins keys; a malformed one is refused and writes nothing."""
    state = tmp_path / "state"
    bad = configure(state, HUB, new_token(), "--release-key", "ed25519:nope")
    assert bad.returncode != 0
    assert "32 bytes" in bad.stderr
    assert not (state / "cloudgpu-agent.conf").exists()
    keys = [
        release_signing.public_key_text(Ed25519PrivateKey.generate().public_key()) for _ in "ab"
    ]
    good = configure(state, HUB, new_token(), *(f"--release-key={k}" for k in [*keys, keys[0]]))
    assert good.returncode == 0, good.stderr
    assert read_file(state)["release_keys"] == ",".join(keys)
