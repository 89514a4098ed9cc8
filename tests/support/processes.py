"""Real hub processes (Daphne, Celery) started by tests, always stopped afterwards."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]


def hub_env(**overrides: str) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


@contextmanager
def running(
    argv: Sequence[str], *, env: dict[str, str] | None = None, log: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``argv`` (a Python module invocation or a tool) for the duration of the block."""
    out = open(log, "wb") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        list(argv),
        cwd=REPO_ROOT,
        env=env or hub_env(),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        stop_tree(process)
        if log is not None:
            out.close()


def stop_tree(process: subprocess.Popen[bytes], timeout_s: float = 20.0) -> None:
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def python_module(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]
