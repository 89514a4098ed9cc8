"""The folder where prometheus_client's multiprocess mode keeps each process's values
(hub/lib/metrics.py). Apart from the metrics themselves so that the runner, which only prepares
the folder, never imports prometheus_client (its values would land in that folder too).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiproc_dir(path: Path) -> Path:
    """An empty folder for the multiprocess values: files of a previous run's processes would
    otherwise be added to this run's counters (and their live gauges never go away)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, mode=0o700)
    return path


def multiproc_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


def mark_process_dead(pid: int, folder: str) -> None:
    """A supervised process exited: drop its live gauges (its counters stay, as they must)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, folder)  # type: ignore[no-untyped-call]
