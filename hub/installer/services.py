"""The agent wheel the hub serves to ``install.sh`` (and to ``cloudgpu-agent upgrade``).

The wheel is built from this repository's ``supplier_agent`` package, once per distinct source
tree: the cache key is the package version plus a digest of every file that goes into the
wheel, so an unchanged tree is never rebuilt and a changed one never serves stale bits.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "supplier_agent"
BUILD_TIMEOUT_S = 300
_VERSION_RE = re.compile(r"""^__version__\s*=\s*["']([^"']+)["']""", re.MULTILINE)


class AgentWheelError(RuntimeError):
    """The agent wheel could not be built."""


@dataclass(frozen=True)
class WheelInfo:
    path: Path
    filename: str
    version: str
    sha256: str


def agent_version(source_root: Path = REPO_ROOT) -> str:
    # Read from the file, not the imported module: the hub may outlive an edit of the tree.
    text = (source_root / PACKAGE / "__init__.py").read_text()
    match = _VERSION_RE.search(text)
    if match is None:
        raise AgentWheelError(f"no __version__ in {PACKAGE}/__init__.py")
    return match.group(1)


def wheel_sources(source_root: Path = REPO_ROOT) -> list[Path]:
    """Every file the wheel is built from, relative to ``source_root``."""
    names = [Path("pyproject.toml"), Path("README.md")]
    names += sorted(p.relative_to(source_root) for p in source_root.glob("LICEN[CS]E*"))
    names += sorted(p.relative_to(source_root) for p in (source_root / PACKAGE).glob("*.py"))
    return [name for name in names if (source_root / name).is_file()]


def source_key(source_root: Path = REPO_ROOT) -> str:
    digest = hashlib.sha256()
    for name in wheel_sources(source_root):
        digest.update(str(name).encode() + b"\0")
        digest.update((source_root / name).read_bytes() + b"\0")
    return f"{agent_version(source_root)}-{digest.hexdigest()[:16]}"


def build_agent_wheel(
    dist_dir: Path | str | None = None, *, source_root: Path = REPO_ROOT
) -> WheelInfo:
    """The wheel for the current source tree, built into ``dist_dir`` unless already there.

    Safe to call from several processes at once: one builds under a file lock, the others
    wait and then find its result.
    """
    dist_dir = Path(dist_dir if dist_dir is not None else settings.AGENT_DIST_DIR)
    dist_dir.mkdir(parents=True, exist_ok=True)
    key = source_key(source_root)
    target = dist_dir / key
    found = _built_wheel(target)
    if found is not None:
        return found
    with _locked(dist_dir / ".build.lock"):
        found = _built_wheel(target)
        if found is not None:
            return found
        with tempfile.TemporaryDirectory(prefix=".build-", dir=dist_dir) as work:
            _build_into(source_root, Path(work), target)
        _remove_older_builds(dist_dir, keep=target)
    found = _built_wheel(target)
    if found is None:
        raise AgentWheelError(f"the build left no wheel in {target}")
    return found


def _build_into(source_root: Path, work: Path, target: Path) -> None:
    # Build from a copy holding only the wheel's sources: an in-tree build would leave build/
    # and *.egg-info in the repository (read-only in the hub image) and could package stale
    # modules from an old build/lib.
    stage = work / "src"
    for name in wheel_sources(source_root):
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source_root / name, stage / name)
    out = work / "wheel"
    out.mkdir()
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    argv = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    result = subprocess.run(
        [*argv, "-w", str(out), str(stage)],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    wheels = list(out.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = (result.stdout + result.stderr)[-4000:]
        raise AgentWheelError(f"pip wheel failed (exit {result.returncode}):\n{tail}")
    # Publishing is one rename, so a reader sees either no build or a whole one.
    out.rename(target)


def _built_wheel(target: Path) -> WheelInfo | None:
    wheels = list(target.glob("*.whl")) if target.is_dir() else []
    if len(wheels) != 1:
        return None
    stat = wheels[0].stat()
    return _wheel_info(str(wheels[0]), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=16)
def _wheel_info(path: str, size: int, mtime_ns: int) -> WheelInfo:
    # size and mtime are part of the cache key only, so a replaced file is hashed again.
    wheel = Path(path)
    digest = hashlib.sha256()
    with wheel.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    version = wheel.name.split("-")[1]
    return WheelInfo(path=wheel, filename=wheel.name, version=version, sha256=digest.hexdigest())


def _remove_older_builds(dist_dir: Path, keep: Path) -> None:
    for entry in dist_dir.iterdir():
        if entry.is_dir() and entry != keep and not entry.name.startswith("."):
            shutil.rmtree(entry, ignore_errors=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
