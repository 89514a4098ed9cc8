"""The agent installs and runs on a host that has no Django."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

from supplier_agent import __version__
from tests.support.processes import REPO_ROOT

AGENT_SCRIPT = Path(sys.executable).with_name("cloudgpu-agent")


def _agent(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(AGENT_SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_version_prints_the_package_version() -> None:
    result = _agent("version")
    assert result.returncode == 0
    assert result.stdout.startswith(f"cloudgpu-agent {__version__} ")


def test_help_exits_zero() -> None:
    result = _agent("--help")
    assert result.returncode == 0
    assert "usage: cloudgpu-agent" in result.stdout


def test_unknown_command_exits_two() -> None:
    result = _agent("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_agent_installs_and_runs_in_a_virtualenv_without_django(tmp_path: Path) -> None:
    env_dir = tmp_path / "agent-venv"
    venv.create(env_dir, with_pip=True)
    pip = env_dir / "bin" / "pip"
    install = subprocess.run(
        [str(pip), "install", "--quiet", "-r", "requirements/agent.txt", "."],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stderr
    python = env_dir / "bin" / "python"
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, supplier_agent.cli;"
            "print(importlib.util.find_spec('django') is None)",
        ],
        cwd=tmp_path,  # not the checkout: import the installed package
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert probe.stdout.strip() == "True"
    version = subprocess.run(
        [str(env_dir / "bin" / "cloudgpu-agent"), "version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert __version__ in version.stdout
