"""An agent installed by the real ``install.sh`` once per test session (per pytest-xdist worker),
and a fresh copy of that installation for each test that starts from "an agent is installed".

A first install (a virtualenv, pip, the agent's ``configure``, ``smoke`` and trial run) takes
seconds; most re-run tests only need its result. A virtualenv is not relocatable (its scripts
name the interpreter by absolute path), so the copy goes back to the very path the install used:
the prefix's path is fixed for the session, and each test gets a ``cp -a`` of the untouched
installation there, on a small tmpfs of its own when it asks for one. The loopback hub the
installation is configured for (the token in its configuration is that hub's) lives as long.

Also here: the helpers that installation needs, shared with the installer's tests
(tests/hub/installer/test_install_faults.py, test_install_atomic.py): running the script as
``curl ... | bash -s``, a hub peer that serves ``/agent/*``, a wheelhouse for offline pip, and a
small tmpfs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.datastructures import Headers
from websockets.http11 import Response

from hub.installer.services import WheelInfo
from tests.support.agents import agent_env, new_token
from tests.support.hub_peer import HubPeer

# The first install tries the new version for this long (`run --trial`, --no-systemd); re-runs
# use 1 s. tests/hub/installer/test_install_atomic.py checks that the first install said so.
FIRST_HEALTH_WINDOW_S = 2


def run_install(
    script: str, *args: str, tmp: Path, env: dict[str, str] | None = None, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    """``curl ... | bash -s -- ARGS``: stdin is the script, so there is no terminal."""
    temp = tmp / "tmp"
    temp.mkdir(exist_ok=True)
    full = agent_env(TMPDIR=str(temp))
    full.update(env or {})
    return subprocess.run(
        ["bash", "-s", "--", *args],
        input=script,
        capture_output=True,
        text=True,
        env=full,
        cwd=tmp,
        timeout=timeout_s,
        check=False,
    )


class AgentHub(HubPeer):
    """The hub as the script sees it: ``/agent/*`` over HTTP and the agent WebSocket, on one
    port, so the installed agent's ``smoke`` reaches it."""

    def __init__(self, token: str, wheel: WheelInfo) -> None:
        super().__init__(token)
        self.offer(wheel)

    def offer(self, wheel: WheelInfo) -> None:
        """Serve ``wheel`` as the current release from now on."""
        release = {
            "version": wheel.version,
            "filename": wheel.filename,
            "sha256": wheel.sha256,
            "url": f"/agent/{wheel.filename}",
        }
        self.files = {
            "/agent/release.json": json.dumps(release).encode(),
            f"/agent/{wheel.filename}": wheel.path.read_bytes(),
        }

    def _check_token(self, connection: Any, request: Any) -> Any:
        if request.path in self.files:
            body = self.files[request.path]
            headers = Headers([("Content-Length", str(len(body))), ("Connection", "close")])
            return Response(200, "OK", headers, body)
        return super()._check_token(connection, request)


@contextmanager
def small_filesystem(where: Path, size_mib: int) -> Iterator[Path]:
    """A tmpfs of ``size_mib`` at ``where``, always unmounted."""
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "cloudgpu-test", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs root): {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=60)


@dataclass(frozen=True)
class InstalledAgent:
    """A first install into ``prefix`` (``--runtime mock``, a token, from ``hub``), done once.

    ``env`` and ``args`` are for re-runs: offline pip, and no token (a re-run must not need
    one). ``first`` is that first run, checked to have succeeded."""

    hub: AgentHub
    root: Path
    template: Path
    first: subprocess.CompletedProcess[str]
    env: dict[str, str]
    args: tuple[str, ...]

    @property
    def prefix(self) -> Path:
        return self.root / "prefix"

    @contextmanager
    def fresh_copy(
        self, *, disk_mib: int | None = None
    ) -> Iterator[tuple[dict[str, str], tuple[str, ...]]]:
        """The installation as the first install left it, at ``prefix`` again, whatever an
        earlier test did to it; with ``disk_mib``, on a tmpfs of that size mounted at ``root``
        (skips where no tmpfs can be mounted). Yields the env and the arguments for re-runs."""
        if self.root.exists():
            shutil.rmtree(self.root)
        if disk_mib is None:
            self.root.mkdir()
            self._restore()
            yield dict(self.env), self.args
            return
        with small_filesystem(self.root, disk_mib):
            self._restore()
            yield dict(self.env), self.args

    def _restore(self) -> None:
        # cp -a: modes, timestamps (so the compiled .pyc files stay valid) and the relative
        # symlink PREFIX/venv -> venvs/<version>, as the install left them.
        subprocess.run(
            ["cp", "-a", str(self.template), str(self.prefix)],
            check=True,
            capture_output=True,
            timeout=120,
        )


@contextmanager
def first_install(
    base: Path, script: str, wheel: WheelInfo, wheelhouse: Path
) -> Iterator[InstalledAgent]:
    """Runs ``script`` once into ``base``/installed/prefix from a live loopback hub and keeps
    an untouched copy of the result, for :meth:`InstalledAgent.fresh_copy`."""
    token = new_token()
    with AgentHub(token, wheel) as hub:
        root = base / "installed"
        prefix = root / "prefix"
        root.mkdir()
        env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse)}
        # Each run tries the new version with `run --trial` first (--no-systemd): briefly here.
        args = ("--prefix", str(prefix), "--no-systemd", "--hub", hub.url, "--health-window", "1")
        first = run_install(
            script,
            *("--prefix", str(prefix), "--no-systemd", "--hub", hub.url),
            *("--health-window", str(FIRST_HEALTH_WINDOW_S), "--runtime", "mock"),
            tmp=base,
            env={**env, "CLOUDGPU_TOKEN": token},
        )
        assert first.returncode == 0, first.stderr
        template = base / "template"
        subprocess.run(
            ["cp", "-a", str(prefix), str(template)], check=True, capture_output=True, timeout=120
        )
        yield InstalledAgent(hub, root, template, first, env, args)
