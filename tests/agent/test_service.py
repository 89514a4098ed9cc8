"""`cloudgpu-agent install-service` / `uninstall-service`, writing the unit into a temp folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.agents import AGENT, agent_env, configure, new_token

UNIT = "cloudgpu-agent.service"


def _agent(*args: str, prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(prefix or []), AGENT, *args],
        capture_output=True,
        text=True,
        env=agent_env(),
        timeout=60,
        check=False,
    )


def _install(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return _agent(
        "install-service",
        "--prefix",
        str(tmp_path / "opt"),
        "--state",
        str(tmp_path / "state"),
        "--unit-dir",
        str(tmp_path / "units"),
        "--no-systemd",
        *extra,
    )


def _fake_install(tmp_path: Path) -> Path:
    """An executable where the unit expects the agent, so `systemd-analyze verify` can check it."""
    script = tmp_path / "opt" / "venv" / "bin" / "cloudgpu-agent"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    return script


def test_install_service_writes_a_unit_without_the_token(tmp_path: Path) -> None:
    token = new_token()
    assert configure(tmp_path / "state", "https://hub.example.com", token).returncode == 0
    agent = _fake_install(tmp_path)

    result = _install(tmp_path)

    assert result.returncode == 0, result.stderr
    assert "not running: systemctl daemon-reload; systemctl enable --now" in result.stdout
    unit = (tmp_path / "units" / UNIT).read_text()
    lines = unit.splitlines()
    assert f"ExecStart={agent} run --state {tmp_path / 'state'}" in lines
    for line in ("Restart=always", "User=root", "KillMode=process", "NoNewPrivileges=yes"):
        assert line in lines
    assert "After=network-online.target docker.service" in lines
    assert token not in unit
    assert token not in result.stdout + result.stderr
    if shutil.which("systemd-analyze"):
        verify = subprocess.run(
            ["systemd-analyze", "verify", str(tmp_path / "units" / UNIT)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert verify.returncode == 0, verify.stderr


def test_install_service_twice_is_a_no_op(tmp_path: Path) -> None:
    _fake_install(tmp_path)
    assert _install(tmp_path).returncode == 0
    unit_path = tmp_path / "units" / UNIT
    first = unit_path.read_text()

    again = _install(tmp_path)

    assert again.returncode == 0, again.stderr
    assert "already up to date" in again.stdout
    assert "daemon-reload" not in again.stdout
    assert unit_path.read_text() == first
    assert sorted(p.name for p in unit_path.parent.iterdir()) == [UNIT]


def test_uninstall_service_removes_the_unit_and_is_idempotent(tmp_path: Path) -> None:
    _fake_install(tmp_path)
    assert _install(tmp_path).returncode == 0
    units = str(tmp_path / "units")

    removed = _agent("uninstall-service", "--unit-dir", units, "--no-systemd")
    again = _agent("uninstall-service", "--unit-dir", units, "--no-systemd")

    assert removed.returncode == 0, removed.stderr
    assert "removed" in removed.stdout
    assert not (tmp_path / "units" / UNIT).exists()
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout


def test_install_service_refuses_paths_systemd_would_split(tmp_path: Path) -> None:
    result = _agent(
        "install-service",
        "--prefix",
        str(tmp_path / "my opt"),
        "--unit-dir",
        str(tmp_path / "units"),
        "--no-systemd",
    )
    assert result.returncode == 1
    assert "systemd would reinterpret" in result.stderr
    assert not (tmp_path / "units").exists()


def test_managing_the_service_without_root_fails_with_the_fix(tmp_path: Path) -> None:
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root and setpriv (util-linux) is missing")
        prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]

    result = _agent("install-service", "--unit-dir", str(tmp_path / "units"), prefix=prefix)

    assert result.returncode == 1
    assert "needs root" in result.stderr
    assert "--no-systemd" in result.stderr
