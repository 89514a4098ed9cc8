from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.agents import AGENT, agent_env, configure, new_token


def test_configure_reads_the_token_from_stdin_into_a_0600_file(tmp_path: Path) -> None:
    token = new_token()
    state = tmp_path / "state"
    result = configure(state, "https://hub.example.com", token, "--runtime", "mock")
    assert result.returncode == 0, result.stderr
    config = state / "cloudgpu-agent.conf"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    text = config.read_text()
    assert f"token = {token}" in text
    assert "runtime = mock" in text
    assert token not in result.stdout + result.stderr


def test_configure_refuses_an_empty_token(tmp_path: Path) -> None:
    result = configure(tmp_path / "state", "https://hub.example.com", "")
    assert result.returncode == 1
    assert "token is empty" in result.stderr
    assert not (tmp_path / "state" / "cloudgpu-agent.conf").exists()


def test_configure_refuses_a_hub_url_that_is_not_http(tmp_path: Path) -> None:
    result = configure(tmp_path / "state", "ftp://hub.example.com", new_token())
    assert result.returncode == 1
    assert "hub URL" in result.stderr


def test_run_without_configuration_says_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run(
        [AGENT, "run", "--state", str(tmp_path / "empty")],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "cloudgpu-agent configure" in result.stderr


def test_environment_overrides_the_config_file(tmp_path: Path) -> None:
    from supplier_agent.config import load

    state = tmp_path / "state"
    token = new_token()
    assert configure(state, "https://hub.example.com", token).returncode == 0
    config = load({"state": str(state)}, env={"CLOUDGPU_RUNTIME": "mock"})
    assert config.runtime == "mock"
    assert config.ws_url == "wss://hub.example.com/api/p2p/ws/"
    flagged = load({"state": str(state), "runtime": "docker"}, env={"CLOUDGPU_RUNTIME": "mock"})
    assert flagged.runtime == "docker"
    assert config.token not in repr(config)


def test_a_hub_url_with_a_path_or_plain_http_to_a_remote_host_is_refused(tmp_path: Path) -> None:
    token = new_token()
    for url, why in (
        (f"https://hub.example.com/api/p2p/ws/{token}", "address only"),
        ("http://hub.example.com", "https://"),
        ("https://user:pw@hub.example.com", "credentials"),
    ):
        result = configure(tmp_path / "state", url, new_token())
        assert result.returncode == 1
        assert why in result.stderr
        assert token not in result.stderr


def test_a_broken_config_file_never_echoes_the_token(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    token = new_token()
    (state / "cloudgpu-agent.conf").write_text(f"token = {token}\n")  # no [agent] section
    result = subprocess.run(
        [AGENT, "run", "--state", str(state)],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "not a valid config file" in result.stderr
    assert token not in result.stderr


def test_configure_keeps_the_suppliers_limits_and_allowed_ranges(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = configure(
        state,
        "https://hub.example.com",
        new_token(),
        "--reserve-memory-mib",
        "4096",
        "--reserve-cpus",
        "1.5",
        "--allow-networks",
        "192.168.7.0/24, 10.9.0.5",
        "--accept-container-escape-risk",
    )
    assert result.returncode == 0, result.stderr
    text = (state / "cloudgpu-agent.conf").read_text()
    assert "reserve_memory_mib = 4096" in text
    assert "reserve_cpus = 1.5" in text
    assert "allow_networks = 192.168.7.0/24, 10.9.0.5" in text
    assert "accept_container_escape_risk = 1" in text

    from supplier_agent.config import load

    config = load({"state": str(state)}, env={})
    assert config.allow_networks == ("192.168.7.0/24", "10.9.0.5/32")
    assert config.reserve.memory_bytes == 4096 * 1024 * 1024
    assert config.reserve.cpus == 1.5
    assert config.accept_container_escape_risk is True


def test_configure_refuses_a_range_that_is_not_one(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = configure(
        state, "https://hub.example.com", new_token(), "--allow-networks", "the office"
    )
    assert result.returncode == 1
    assert "'the office' is not a network" in result.stderr
    assert not (state / "cloudgpu-agent.conf").exists()


def test_cache_cleanup_settings_come_from_the_environment(tmp_path: Path) -> None:
    from supplier_agent.config import ConfigError, load

    state = tmp_path / "state"
    assert configure(state, "https://hub.example.com", new_token()).returncode == 0
    env = {"CLOUDGPU_VOLUME_IDLE_DAYS": "3", "CLOUDGPU_DISK_FLOOR_GIB": "50"}

    config = load({"state": str(state)}, env=env)

    assert (config.volume_idle_days, config.disk_floor_gib) == (3.0, 50.0)
    with pytest.raises(ConfigError, match="volume_idle_days must be a number"):
        load({"state": str(state)}, env={"CLOUDGPU_VOLUME_IDLE_DAYS": "two weeks"})


def test_housekeeping_times_come_from_the_environment_with_a_floor(tmp_path: Path) -> None:
    from supplier_agent.config import ConfigError, load

    state = tmp_path / "state"
    assert configure(state, "https://hub.example.com", new_token()).returncode == 0
    default = load({"state": str(state)}, env={})
    assert (default.housekeeping_first_s, default.housekeeping_every_s) == (60.0, 3600.0)

    env = {"CLOUDGPU_HOUSEKEEPING_FIRST_S": "5", "CLOUDGPU_HOUSEKEEPING_EVERY_S": "0"}
    config = load({"state": str(state)}, env=env)
    # Never a busy loop: at most once a second however small the setting.
    assert (config.housekeeping_first_s, config.housekeeping_every_s) == (5.0, 1.0)
    with pytest.raises(ConfigError, match="housekeeping_first_s cannot be negative"):
        load({"state": str(state)}, env={"CLOUDGPU_HOUSEKEEPING_FIRST_S": "-1"})
