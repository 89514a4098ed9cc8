"""Real ``cloudgpu-agent`` processes for tests: configured through the CLI, token on stdin."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

AGENT = str(Path(sys.executable).with_name("cloudgpu-agent"))


def new_token() -> str:
    return f"cgpu_test_{secrets.token_urlsafe(24)}"


def agent_env(**extra: str) -> dict[str, str]:
    # Nothing from the test process's own configuration may leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDGPU_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    # Below a supplier's floor (20 GiB by default) the agent takes no rentals (disk_guard.py);
    # the machines tests run on may have less free than that. tests/e2e/test_hostile_disk.py
    # tests the floor itself.
    env.setdefault("CLOUDGPU_DISK_FLOOR_GIB", "1")
    # Volume usage reported every 10 s, not after the first minute and then hourly: the
    # volume tests wait for a report (tests/e2e/test_renter_volumes.py).
    env.setdefault("CLOUDGPU_HOUSEKEEPING_FIRST_S", "10")
    env.setdefault("CLOUDGPU_HOUSEKEEPING_EVERY_S", "10")
    return env


def configure(
    state: Path, hub_url: str, token: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, "configure", "--state", str(state), "--hub", hub_url, *args],
        input=token + "\n",
        capture_output=True,
        text=True,
        env=env or agent_env(),
        timeout=60,
        check=False,
    )


@contextmanager
def running_agent(
    state: Path, log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [AGENT, "run", "--state", str(state), *args],
            env=env or agent_env(),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
