"""``install.sh`` run for real by bash (issue 34): a failed install or re-install changes no file,
a re-install changes only what it was told to, a version whose ``run`` dies is not switched to
without systemd, a user outside the ``docker`` group is told so, and a full disk (bytes or
inodes), a redirect refused and a hub URL with a path each get one clear line.

The servers, fixtures and helpers are ``test_install_faults.py``'s. A re-run starts from a
copy of one first install per session (the ``installed_agent`` fixture,
tests/hub/installer/conftest.py), at the path it was made at, configured for a hub that lives as
long.
"""

from __future__ import annotations

import configparser
import grp
import hashlib
import os
import re
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from hub.installer.services import WheelInfo
from hub.lib.ports import free_port
from supplier_agent import __version__, release_signing
from tests.agent import test_upgrade_faults
from tests.agent.test_upgrade import Wheel
from tests.hub.installer import test_install_faults
from tests.hub.installer.test_install_faults import MARKER, Served, release_routes
from tests.support.agents import new_token
from tests.support.installed_agent import FIRST_HEALTH_WINDOW_S, InstalledAgent, run_install

# Virtualenvs, pip and real agents: seconds each, out of the fast lane (tests/conftest.py).
pytestmark = pytest.mark.slow

# The same fixtures: the script as the hub serves it, and a wheel that installs, says its
# version and passes `smoke`, then dies as soon as `run` starts. (The wheelhouse for offline pip
# and the installed agent are tests/hub/installer/conftest.py's.)
script = test_install_faults.script
dies_in_run = test_upgrade_faults.dies_in_run

# Keys `configure` never writes and the old installer dropped on a re-install, plus ones only a
# newer (or older) agent knows: a re-install must keep them all.
EXTRA_SETTINGS = {
    "log_level": "DEBUG",
    "volume_idle_days": "3",
    "disk_floor_gib": "1",
    "container_log_mib": "16",
    "compute_mode": "skip",
    "a_setting_from_a_newer_agent": "kept as it is",
}


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a file's mode and sha256, a symlink's target, a folder's
    mode. Two equal snapshots: nothing was added, removed or changed by a byte."""
    entries: dict[str, str] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            info = path.lstat()
            key = str(path.relative_to(root))
            if stat.S_ISLNK(info.st_mode):
                entries[key] = f"-> {os.readlink(path)}"
            elif stat.S_ISDIR(info.st_mode):
                entries[key] = f"dir {stat.S_IMODE(info.st_mode):o}"
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                entries[key] = f"{stat.S_IMODE(info.st_mode):o} {digest}"
    return entries


def assert_one_clear_failure(stderr: str, *roots: Path) -> str:
    """No traceback, and a last line from the script itself; every path under one of ``roots``
    it names exists (none is the side folder it has just removed)."""
    assert "Traceback" not in stderr, stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"{MARKER} error: "), stderr
    for named in re.findall(r"/[^\s;:,()'\"]+", last):
        if named.startswith(tuple(str(root) for root in roots)):
            assert Path(named).exists(), f"the message names {named}, which does not exist: {last}"
    return last


def read_config(path: Path) -> dict[str, str]:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    return dict(parser["agent"])


def add_settings(path: Path, settings: dict[str, str]) -> None:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(path)
    for key, value in settings.items():
        parser["agent"][key] = value
    with open(path, "w") as out:
        parser.write(out)


# --- 2: a failed install or re-install changes no file -----------------------------------------


def test_a_rerun_whose_hub_check_fails_changes_no_file(
    script: str, agent_wheel: WheelInfo, installed_agent: InstalledAgent, tmp_path: Path
) -> None:
    prefix = installed_agent.prefix
    with installed_agent.fresh_copy() as (env, args):
        before = snapshot(prefix)
        # Serves the release, but no agent WebSocket: the new version's `smoke` fails there.
        with Served(release_routes(agent_wheel)) as elsewhere:
            moved = run_install(script, *args, "--hub", elsewhere.url, tmp=tmp_path, env=env)
            assert f"/agent/{agent_wheel.filename}" in elsewhere.requests

    assert moved.returncode != 0
    last = assert_one_clear_failure(moved.stderr, tmp_path, installed_agent.root)
    assert "nothing was changed" in last
    assert f"{prefix}/venv/bin/cloudgpu-agent doctor" in last
    assert snapshot(prefix) == before
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_first_install_whose_hub_check_fails_leaves_nothing(
    script: str, agent_wheel: WheelInfo, wheelhouse: Path, tmp_path: Path
) -> None:
    prefix, state = tmp_path / "prefix", tmp_path / "state"
    with Served(release_routes(agent_wheel)) as hub:
        result = run_install(
            script,
            *("--prefix", str(prefix), "--state", str(state), "--no-systemd"),
            *("--runtime", "mock", "--hub", hub.url, "--health-window", "1"),
            tmp=tmp_path,
            env={
                "CLOUDGPU_TOKEN": new_token(),
                "PIP_NO_INDEX": "1",
                "PIP_FIND_LINKS": str(wheelhouse),
            },
        )
    assert result.returncode != 0
    last = assert_one_clear_failure(result.stderr, tmp_path)
    assert "connection check failed" in last
    assert not prefix.exists()
    assert not state.exists()


# --- 3: a re-install changes only what it was told to ------------------------------------------


def test_a_rerun_with_a_runtime_or_a_token_keeps_every_other_setting(
    script: str, installed_agent: InstalledAgent, tmp_path: Path
) -> None:
    """Also test_install_faults.py's former test_a_rerun_with_an_option_changes_only_that_setting:
    its re-run (runtime docker to mock, compute mode skip) is the first one here."""
    prefix = installed_agent.prefix
    config = prefix / "state" / "cloudgpu-agent.conf"
    with installed_agent.fresh_copy() as (env, args):
        token = read_config(config)["token"]
        add_settings(config, {**EXTRA_SETTINGS, "runtime": "docker"})
        with open(config, "a") as out:
            out.write("\n[a-section-from-a-newer-agent]\nsome_key = 1\n")
        expected = read_config(config)

        # A new runtime: that and nothing else changes. Docker to mock, not the other way: the
        # new version's trial run (--no-systemd) starts the runtime it is configured with, and
        # this host may have no Docker.
        runtime = run_install(script, *args, "--runtime", "mock", tmp=tmp_path, env=env)
        assert runtime.returncode == 0, runtime.stderr
        assert read_config(config) == {**expected, "runtime": "mock"}
        changed = read_config(config)
        assert changed["runtime"] == "mock"
        assert changed["compute_mode"] == "skip"
        assert changed["token"] == token

        # A token (as from a new install command): the token and nothing else.
        again = run_install(script, *args, tmp=tmp_path, env={**env, "CLOUDGPU_TOKEN": token})
        assert again.returncode == 0, again.stderr
        assert read_config(config) == {**expected, "runtime": "mock"}

        # Release keys (as an install command from a hub that signs releases): pinned, and
        # nothing else changes. (A malformed key: tests/agent/test_configure_options.py.)
        key = release_signing.public_key_text(Ed25519PrivateKey.generate().public_key())
        pinned = run_install(script, *args, "--release-key", key, tmp=tmp_path, env=env)
        assert pinned.returncode == 0, pinned.stderr
        assert read_config(config) == {**expected, "runtime": "mock", "release_keys": key}

    parser = configparser.ConfigParser(interpolation=None)
    parser.read(config)
    assert parser["a-section-from-a-newer-agent"]["some_key"] == "1"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert token not in runtime.stdout + runtime.stderr + again.stderr
    assert not list(config.parent.glob(".*"))  # no staged or temporary file left


# --- 4: without systemd, a version whose `run` dies is never switched to ------------------------


def _info(wheel: Wheel) -> WheelInfo:
    return WheelInfo(wheel.path, wheel.path.name, wheel.version, wheel.sha256)


def test_a_version_that_dies_in_run_is_not_switched_to_without_systemd(
    script: str,
    agent_wheel: WheelInfo,
    installed_agent: InstalledAgent,
    dies_in_run: Wheel,
    tmp_path: Path,
) -> None:
    # The first install (the session's, with a window of 2 s) ran this tree's version's trial.
    first, hub, prefix = installed_agent.first, installed_agent.hub, installed_agent.prefix
    with installed_agent.fresh_copy() as (env, _):
        args = ("--prefix", str(prefix), "--no-systemd", "--hub", hub.url, "--health-window", "2")
        before = snapshot(prefix)

        # The hub now offers the version that passes `smoke` and dies in `run`.
        hub.offer(_info(dies_in_run))
        try:
            result = run_install(script, *args, tmp=tmp_path, env=env)
        finally:
            hub.offer(agent_wheel)  # the session's hub: the next test's re-runs get this tree's

    assert result.returncode != 0
    assert f"trying cloudgpu-agent {__version__} for {FIRST_HEALTH_WINDOW_S} s" in first.stderr
    assert f"trying cloudgpu-agent {dies_in_run.version} for 2 s" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"{MARKER} error: cloudgpu-agent {dies_in_run.version} failed its 2 s")
    assert "deliberately dies in run" in last
    assert "nothing was changed" in last
    assert snapshot(prefix) == before
    assert list((tmp_path / "tmp").iterdir()) == []


# --- 5: a user outside the docker group -----------------------------------------------------------


@contextmanager
def shared_folder() -> Iterator[Path]:
    """A folder another user can work in (pytest's own are root's, mode 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="cloudgpu-install-"))
    try:
        folder.chmod(0o777)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("runtime", ["docker", "mock"])
def test_a_user_outside_the_docker_group_is_told_which_group_and_how(
    script: str, runtime: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the script as another user")
    nobody = 65534
    group = next((g for g in ("docker", "adm", "root") if _group_exists(g)), "root")
    with shared_folder() as folder:
        # Docker's socket as a distribution sets it up: root:docker, 0660; nothing listens.
        sock_path = folder / "docker.sock"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(sock_path))
        os.chown(sock_path, 0, grp.getgrnam(group).gr_gid)
        sock_path.chmod(0o660)
        prefix = folder / "prefix"
        args = ["--prefix", str(prefix), "--no-systemd", "--hub", f"http://127.0.0.1:{free_port()}"]
        if runtime == "mock":
            args += ["--runtime", "mock"]
        env = {
            "CLOUDGPU_TOKEN": new_token(),
            "DOCKER_HOST": f"unix://{sock_path}",
            "HOME": str(folder),
            "TMPDIR": str(folder),
            # The system's Python: root's own (pyenv, /root) is out of this user's reach.
            "PATH": "/usr/local/bin:/usr/bin:/bin",
        }
        result = subprocess.run(
            ["bash", "-s", "--", *args],
            input=script,
            capture_output=True,
            text=True,
            env=env,
            cwd=folder,
            user=nobody,
            group=nobody,
            extra_groups=[],
            timeout=120,
            check=False,
        )
        listener.close()
        left = sorted(p.name for p in folder.iterdir())

    user = subprocess.run(["id", "-un", str(nobody)], capture_output=True, text=True).stdout.strip()
    fix = f"Fix: sudo usermod -aG {group} {user}, then log in again"
    assert "does not answer" not in result.stderr
    assert "Traceback" not in result.stderr
    if runtime == "docker":
        assert result.returncode == 1, result.stderr
        (line,) = result.stderr.strip().splitlines()[-1:]
        assert line.startswith(f"{MARKER} error: {user} cannot use Docker's socket {sock_path}")
        assert f"it is for the {group} group" in line
        assert fix in line
        assert "fetching" not in result.stderr
        assert left == ["docker.sock"]  # nothing installed
    else:
        assert f"{MARKER} warning: {user} cannot use Docker's socket" in result.stderr
        assert fix in result.stderr
        assert "fetching the agent release" in result.stderr  # it went on (to a hub not there)
        assert result.returncode == 3


def _group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


# --- 6: messages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/x", "/some/path/", "/?next=1"])
def test_a_hub_url_with_a_path_is_refused_in_one_line(
    script: str, agent_wheel: WheelInfo, tmp_path: Path, path: str
) -> None:
    prefix = tmp_path / "prefix"
    with Served(release_routes(agent_wheel)) as server:
        result = run_install(
            script,
            *("--prefix", str(prefix), "--no-systemd", "--runtime", "mock"),
            *("--hub", f"{server.url}{path}"),
            tmp=tmp_path,
            env={"CLOUDGPU_TOKEN": new_token()},
        )
        assert server.requests == []
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"{MARKER} error: --hub takes the hub's address only")
    assert not prefix.exists()


def test_a_rerun_with_a_hub_path_is_refused_before_it_touches_anything(
    script: str, agent_wheel: WheelInfo, installed_agent: InstalledAgent, tmp_path: Path
) -> None:
    """A hub that a proxy serves under a path too: once the whole new version was installed,
    then `configure` refused the URL, and the kept token piped to it could end in a
    BrokenPipeError traceback (when `configure` had exited first)."""
    prefix = installed_agent.prefix
    routes = {f"/x{path}": send for path, send in release_routes(agent_wheel).items()}
    with installed_agent.fresh_copy() as (env, args):
        before = snapshot(prefix)
        with Served(routes) as proxied:
            result = run_install(script, *args, "--hub", f"{proxied.url}/x", tmp=tmp_path, env=env)
    assert "Traceback" not in result.stderr
    assert result.returncode == 2
    assert "--hub takes the hub's address only" in result.stderr
    assert proxied.requests == []
    assert snapshot(prefix) == before


# A python3 ahead of the real one on PATH: at `python3 -m venv` it fills the disk at $FILL_DISK
# (bytes or inodes), before the venv is made (venv fails) or after it (pip fails), as another
# program filling the disk meanwhile would.
FILLING_PYTHON = r"""#!/bin/bash
fill() {
  "$REAL_PYTHON" -c 'import os, sys
folder, what = sys.argv[1], sys.argv[2]
os.makedirs(folder, exist_ok=True)
try:
    if what == "bytes":
        with open(os.path.join(folder, "big"), "wb") as out:
            while True:
                out.write(bytes(1 << 20))
                out.flush()
    n = 0
    while True:
        open(os.path.join(folder, str(n)), "w").close()
        n += 1
except OSError:
    pass' "$FILL_DISK/filler" "$1"
}
if [[ ${1:-} == -m && ${2:-} == venv ]]; then
  case $FILL_WHEN in
    before-venv) fill "$FILL_WHAT" ;;
    before-pip)
      rc=0
      "$REAL_PYTHON" "$@" || rc=$?
      fill "$FILL_WHAT"
      exit "$rc"
      ;;
  esac
fi
exec "$REAL_PYTHON" "$@"
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (needs root)")
def test_a_full_disk_is_named_as_such_and_changes_nothing(
    script: str, installed_agent: InstalledAgent, tmp_path: Path
) -> None:
    real_python = shutil.which("python3")
    assert real_python is not None
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3").write_text(FILLING_PYTHON)
    (shims / "python3").chmod(0o755)
    # The installed agent, on a tmpfs of 320 MiB of its own (mounted at `disk`).
    disk, prefix = installed_agent.root, installed_agent.prefix
    with installed_agent.fresh_copy(disk_mib=320) as (env, args):
        subprocess.run(["mount", "-o", "remount,nr_inodes=40000", str(disk)], check=True)
        before = snapshot(prefix)

        # Out of inodes before it starts: refused up front.
        filler = disk / "filler"
        filler.mkdir()
        free = os.statvfs(disk).f_favail
        for n in range(free - 5000):
            (filler / str(n)).touch()
        refused = run_install(script, *args, tmp=tmp_path, env=env)
        assert refused.returncode == 1
        last = assert_one_clear_failure(refused.stderr, tmp_path, disk)
        assert f"{prefix} needs 20000 free inodes" in last
        assert "nothing was changed" in last
        assert snapshot(prefix) == before
        shutil.rmtree(filler)

        # Filled meanwhile: after the checks, before or during the install.
        for when, what, says in [
            ("before-venv", "bytes", "could not create the virtual environment: "),
            ("before-venv", "inodes", "could not create the virtual environment: "),
            ("before-pip", "bytes", "pip could not install the agent: "),
        ]:
            full = {"bytes": "is full", "inodes": "has no free inodes left"}[what]
            result = run_install(
                script,
                *args,
                tmp=tmp_path,
                env={
                    **env,
                    "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}",
                    "REAL_PYTHON": real_python,
                    "FILL_DISK": str(disk),
                    "FILL_WHEN": when,
                    "FILL_WHAT": what,
                },
            )
            assert result.returncode == 1, result.stderr
            last = assert_one_clear_failure(result.stderr, tmp_path, disk)
            assert says in last, (when, what, result.stderr)
            # pip removes what it unpacked on the way out: its log says why instead.
            assert f"the disk of {prefix} {full}" in last or (
                when == "before-pip" and "a disk filled up (No space left on device)" in last
            ), (when, what, result.stderr)
            assert "nothing was changed" in last
            assert "Errno" not in result.stderr
            assert snapshot(prefix) == before, (when, what)
            shutil.rmtree(filler)
