"""`python -m hub.runner serve` (what `make run` starts) as a test's subprocess: on the test
database and Redis, without the demo agent and gateway, with the tests' fast timings; returned
once /healthz answers, stopped with Ctrl-C (then killed) after."""

from __future__ import annotations

import hashlib
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from hub.lib.embedded import SHARED_PGINSTALL_DIR
from tests.support import hub_stack
from tests.support.hub_stack import FAST_TIMINGS
from tests.support.polling import wait_for
from tests.support.processes import REPO_ROOT, hub_env


@contextmanager
def serving(state: Path, port: int, *options: str) -> Iterator[subprocess.Popen[str]]:
    """The runner on ``port`` with its state in ``state``; ``options`` go to ``serve``."""
    env = hub_env(
        DATABASE_URL=hub_stack.test_database_url(),
        DEBUG="1",
        HUB_DEMO_AGENT="0",
        HUB_DEMO_GATEWAY="0",
        **FAST_TIMINGS,
    )
    argv = [sys.executable, "-m", "hub.runner", "serve", "--state", str(state)]
    process = subprocess.Popen(
        [*argv, "--port", str(port), *options],
        cwd=REPO_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    stdout = process.stdout
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(iter(stdout.readline, "")))
    reader.start()

    def healthy() -> bool:
        assert process.poll() is None, "runner exited early:\n" + "".join(output)
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        # A probe is one loopback request: polling often costs little and ends the wait sooner.
        wait_for(healthy, timeout_s=180, interval_s=0.1, what=f"/healthz on port {port}")
        yield process
    finally:
        stop(process, reader)


def stop(process: subprocess.Popen[str], reader: threading.Thread) -> None:
    """Ctrl-C, as a person stops `make run`, then kill after 90 s; the output reader joined."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=90)
        except subprocess.TimeoutExpired:
            process.kill()
    reader.join(timeout=10)
    if process.stdout is not None:
        process.stdout.close()


def remove_moved_folders(state: Path) -> None:
    """The gateway's files and the cluster that the runner keeps in the system folder for a
    state folder that sshd or cloudgpu-pg cannot use: the state folder's own clean-up does not
    reach them. Each is named for a digest of its own folder's path in the state folder
    (hub/lib/demo_gateway.py, hub/lib/embedded.py's _cluster_root)."""
    state = state.resolve()
    for prefix, path in (("gateway", state), ("postgres", state / "postgres")):
        digest = hashlib.sha256(str(path).encode()).hexdigest()[:16]
        shutil.rmtree(SHARED_PGINSTALL_DIR / f"{prefix}-{digest}", ignore_errors=True)
