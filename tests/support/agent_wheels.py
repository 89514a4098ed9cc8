"""Agent wheels built from this repository with another version (and, for tests of what must
go wrong, an edit), their dependencies downloaded once into a wheelhouse for an offline pip,
and virtualenvs installed from them: the material of the upgrade and rollout tests."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from supplier_agent import __version__
from tests.support.agents import agent_env
from tests.support.processes import REPO_ROOT

PIP_TIMEOUT_S = 600
# Edits of the package's files, by path under supplier_agent/: old text -> new text.
Edit = Callable[[Path], None]


@dataclass(frozen=True)
class Wheel:
    path: Path
    version: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False, **kwargs
    )
    assert result.returncode == 0, f"{argv}: {result.stderr}"
    return result


def build_wheel(work: Path, out: Path, version: str, *, edit: Edit | None = None) -> Wheel:
    """Build the agent wheel from a copy of the repository with ``__version__`` replaced and
    ``edit`` applied to the copy's package folder; its source stays in ``work/src-<version>``."""
    source = work / f"src-{version}"
    shutil.copytree(
        REPO_ROOT / "supplier_agent",
        source / "supplier_agent",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    init = source / "supplier_agent" / "__init__.py"
    text = init.read_text()
    assert f'__version__ = "{__version__}"' in text
    init.write_text(text.replace(f'__version__ = "{__version__}"', f'__version__ = "{version}"'))
    if edit is not None:
        edit(source / "supplier_agent")
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.iterdir())
    run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "-w", str(out), str(source)),
        ]
    )
    (path,) = set(out.iterdir()) - before
    return Wheel(path, version)


def download_wheelhouse(wheelhouse: Path) -> Path:
    run(
        [
            *(sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"),
            *("-r", str(REPO_ROOT / "requirements" / "agent.txt"), "-d", str(wheelhouse)),
        ]
    )
    return wheelhouse


def pip_env(wheelhouse: Path, **extra: str) -> dict[str, str]:
    """An agent's environment whose pip installs from ``wheelhouse`` only (pip's own
    ``PIP_*`` variables reach the pip an upgrade runs)."""
    return agent_env(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheelhouse), **extra)


def install_venv(venv: Path, wheel: Wheel, wheelhouse: Path) -> Path:
    run([sys.executable, "-m", "venv", str(venv)])
    run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel.path)],
        env=pip_env(wheelhouse),
    )
    return venv
