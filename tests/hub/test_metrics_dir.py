"""hub/lib/metrics_dir.py and the runner's use of it: the multiprocess metrics folder starts
empty, and a supervised process that dies takes its live gauges with it."""

from __future__ import annotations

import sys
from pathlib import Path

from hub.lib import metrics_dir
from hub.lib.supervise import Supervisor
from tests.support.polling import wait_for


def test_the_folder_is_emptied_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "prometheus"
    folder.mkdir()
    (folder / "counter_4242.db").write_bytes(b"a previous run's values")
    assert metrics_dir.prepare_multiproc_dir(folder) == folder
    assert list(folder.iterdir()) == []


def test_a_dead_childs_live_gauges_go_and_its_counters_stay(tmp_path: Path) -> None:
    folder = metrics_dir.prepare_multiproc_dir(tmp_path / "prometheus")
    supervisor = Supervisor()
    died: list[int] = []
    try:
        child = supervisor.start("short", [sys.executable, "-c", "pass"])
        (folder / f"gauge_livesum_{child.pid}.db").write_bytes(b"")
        (folder / f"counter_{child.pid}.db").write_bytes(b"")
        wait_for(child.exited, timeout_s=30, what="the child to exit")
        supervisor.restart_exited(lambda line: None, died=died.append)
        supervisor.restart_exited(lambda line: None, died=died.append)  # heard once
        assert died == [child.pid]
        metrics_dir.mark_process_dead(child.pid, str(folder))
        assert sorted(p.name for p in folder.iterdir()) == [f"counter_{child.pid}.db"]
    finally:
        supervisor.stop_all(timeout_s=10)
