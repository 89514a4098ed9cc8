"""Allocation tracing for long runs (bench/soak.py, docs/benchmarks.md issue 23).

With ``CLOUDGPU_TRACEMALLOC_DIR`` set, the agent traces its allocations from start-up and
SIGUSR2 writes a tracemalloc snapshot into that folder, named ``agent-<pid>-<time>.tracemalloc``.
Nothing otherwise: tracing slows everything down and is for finding what grows, not for
suppliers' hosts.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import tracemalloc
from collections.abc import Mapping
from pathlib import Path

FRAMES = 12
ENV = "CLOUDGPU_TRACEMALLOC_DIR"

log = logging.getLogger("cloudgpu.agent")


def snapshot_folder(env: Mapping[str, str]) -> Path | None:
    folder = env.get(ENV, "")
    return Path(folder) if folder else None


def start(env: Mapping[str, str] = os.environ) -> Path | None:
    """Start tracing if the environment asks for it; the folder snapshots go to, or None."""
    folder = snapshot_folder(env)
    if folder is not None and not tracemalloc.is_tracing():
        tracemalloc.start(FRAMES)
    return folder


def write_snapshot(folder: Path) -> Path:
    path = folder / f"agent-{os.getpid()}-{time.time():.0f}.tracemalloc"
    tracemalloc.take_snapshot().dump(str(path))
    log.info("tracemalloc snapshot written to %s", path)
    return path


def on_sigusr2(loop: asyncio.AbstractEventLoop, folder: Path | None) -> None:
    """Write a snapshot on each SIGUSR2, from the event loop (never inside a signal frame)."""
    if folder is not None:
        loop.add_signal_handler(signal.SIGUSR2, write_snapshot, folder)
