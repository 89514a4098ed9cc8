"""`run` (and `run --trial`) with the Docker runtime on a host whose engine this user cannot use
(issue 34, item 5): one line naming the socket, its group and the fix, exit 1; not the SDK's
five chained tracebacks.

No engine is started or asked for anything: each test points DOCKER_HOST at a unix socket of
its own (listening, but not for this user; bound but not listening; missing).
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agents import AGENT, agent_env, configure, new_token

MODES = [["run"], ["run", "--trial", "1"]]


def _docker_state(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    # No hub is reached: the agent stops at the Docker engine, before any connection.
    assert (
        configure(state, "http://127.0.0.1:9", new_token(), "--runtime", "docker").returncode == 0
    )
    return state


def _run(argv: list[str], state: Path, docker_host: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*argv, "--state", str(state)],
        capture_output=True,
        text=True,
        env=agent_env(DOCKER_HOST=docker_host),
        timeout=120,
        check=False,
    )


@contextlib.contextmanager
def _listening(path: Path) -> Iterator[socket.socket]:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen()
        yield server
    finally:
        server.close()


def _nobody() -> tuple[int, int, str]:
    try:
        user = pwd.getpwnam("nobody")
        uid, gid = user.pw_uid, user.pw_gid
    except KeyError:
        uid = gid = 65534
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return uid, gid, group


@pytest.mark.parametrize("mode", MODES, ids=["run", "trial"])
def test_no_access_to_the_docker_socket_is_one_line_with_the_group_and_the_fix(
    tmp_path: Path, mode: list[str]
) -> None:
    # Root can open any socket; without CAP_DAC_OVERRIDE (dropped by setpriv, for the agent
    # only) root is held to the file's mode like any other user, which is a supplier's
    # account outside the socket's group: the socket is nobody's, mode 0660.
    if os.geteuid() != 0:
        pytest.skip("needs root, to give the socket to another user")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    state = _docker_state(tmp_path)
    path = tmp_path / "docker.sock"
    uid, gid, group = _nobody()
    with _listening(path):
        os.chown(path, uid, gid)
        os.chmod(path, 0o660)
        drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all"]
        result = _run([*drop, AGENT, *mode], state, f"unix://{path}")

    assert result.returncode == 1, result.stderr
    # It was five chained tracebacks (PermissionError, urllib3, requests, docker, ours).
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"cloudgpu-agent: cannot use Docker: this user (root) may not open {path} (mode 0660, "
        f"group {group}); add the user to that group with `sudo usermod -aG {group} root` "
        "and log in again"
    ]


@pytest.mark.parametrize("mode", MODES, ids=["run", "trial"])
@pytest.mark.parametrize("socket_kind", ["missing", "not-listening"])
def test_no_docker_daemon_is_one_line_saying_so(
    tmp_path: Path, mode: list[str], socket_kind: str
) -> None:
    state = _docker_state(tmp_path)
    path = tmp_path / "docker.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if socket_kind == "not-listening":
        stale.bind(str(path))  # what a daemon that died leaves behind
    try:
        result = _run([AGENT, *mode], state, f"unix://{path}")
    finally:
        stale.close()

    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"cloudgpu-agent: cannot use Docker: nothing answers at {path}, so the Docker daemon is "
        "not running; start it (`sudo systemctl start docker`) or point DOCKER_HOST at it"
    ]
