"""hub/lib/metrics_dir.py: the multiprocess metrics folder shared by processes that do not share
pid numbers (containers: pid 1 in each), dead processes folded into one archive, and the
runner's use of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hub.lib import metrics_dir
from hub.lib.supervise import Supervisor
from tests.support.polling import wait_for
from tests.support.processes import REPO_ROOT

# One hub process's metrics: it makes them (hub/lib/metrics.py), says its pid, then on "go"
# counts heartbeats (and, with a third argument, forks a child that counts some too, as
# Celery's pool does) and holds one connected agent until its stdin closes.
WRITER = """
import os, sys
from hub.lib import metrics
print(os.getpid(), flush=True)
sys.stdin.readline()
metrics.HEARTBEATS.inc(int(sys.argv[1]))
metrics.AGENTS_CONNECTED.inc()
if len(sys.argv) > 2:
    child = os.fork()
    if child == 0:
        metrics.HEARTBEATS.inc(int(sys.argv[2]))
        os._exit(0)
    os.waitpid(child, 0)
print("done", flush=True)
sys.stdin.read()
"""


def _scrape(monkeypatch: pytest.MonkeyPatch, folder: Path) -> dict[str, float]:
    """The folder as /metrics reads it (hub/health/metrics_view.py), sample name -> value."""
    monkeypatch.setenv(metrics_dir.MULTIPROC_ENV, str(folder))
    text = generate_latest(metrics_dir.registry()).decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


class _Writer:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        assert process.stdout is not None
        self.pid = int(process.stdout.readline())

    def go(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == "done\n"

    def end(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        assert self.process.wait(timeout=30) == 0


@pytest.fixture
def writers(tmp_path: Path) -> Iterator[tuple[Path, list[_Writer]]]:
    """Two writer processes sharing one folder, each pid 1 in a pid namespace of its own."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("pid namespaces need root and unshare (util-linux)")
    folder = metrics_dir.prepare_multiproc_dir(tmp_path / "prometheus")
    env = os.environ | {metrics_dir.MULTIPROC_ENV: str(folder), "PYTHONPATH": str(REPO_ROOT)}
    started: list[_Writer] = []
    with ExitStack() as stack:
        for counts in (["3", "2"], ["5"]):
            process = subprocess.Popen(
                [unshare, "--pid", "--fork", sys.executable, "-c", WRITER, *counts],
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            stack.callback(process.kill)
            stack.enter_context(process)
            started.append(_Writer(process))
        yield folder, started


def test_processes_with_the_same_pid_in_two_containers_add_up(
    writers: tuple[Path, list[_Writer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, (first, second) = writers
    assert first.pid == second.pid == 1, "each is pid 1, as in a container of its own"
    # Both have made their metrics (read 0) before either counts: with files named by pid they
    # would write one slot of one file, and the last write would win.
    first.go()
    second.go()
    values = _scrape(monkeypatch, folder)
    assert values["cloudgpu_heartbeats_total"] == 3 + 2 + 5
    assert values["cloudgpu_agents_connected"] == 2

    # A process gone (the kernel drops its lock): its gauge goes, its counts stay, and its
    # files (and its forked child's) are folded into the archive.
    first.end()
    values = _scrape(monkeypatch, folder)
    assert values["cloudgpu_heartbeats_total"] == 10
    assert values["cloudgpu_agents_connected"] == 1
    second.end()
    values = _scrape(monkeypatch, folder)
    assert values["cloudgpu_heartbeats_total"] == 10
    assert values.get("cloudgpu_agents_connected", 0) == 0
    assert sorted(p.name for p in folder.glob("*.db")) == [
        "counter_archive.db",
        "histogram_archive.db",
    ]
    assert list((folder / metrics_dir.LOCKS).iterdir()) == []


def test_a_sweep_leaves_a_live_process_alone(
    writers: tuple[Path, list[_Writer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, (first, second) = writers
    first.go()
    second.go()
    files = sorted(p.name for p in folder.glob("*.db"))
    # The forked child (pid 2 in the first namespace) is gone: only its files are folded in.
    swept = metrics_dir.sweep(str(folder), wait=True)
    assert len(swept) == 1
    assert "-2-" in swept[0]
    assert metrics_dir.sweep(str(folder), wait=True) == []
    left = {p.name for p in folder.glob("*.db")}
    assert set(files) - left == {name for name in files if swept[0] in name}
    assert len({name.rsplit("_", 1)[1] for name in left}) == 3, "two writers and the archive"
    assert _scrape(monkeypatch, folder)["cloudgpu_heartbeats_total"] == 10


def test_the_folder_is_emptied_at_start(tmp_path: Path) -> None:
    folder = tmp_path / "prometheus"
    folder.mkdir()
    (folder / "counter_4242.db").write_bytes(b"a previous run's values")
    assert metrics_dir.prepare_multiproc_dir(folder) == folder
    assert list(folder.iterdir()) == []


def test_files_without_a_live_writer_are_swept(tmp_path: Path) -> None:
    """A writer with no lock (an older hub's pid-named files, or one whose lock is gone)."""
    folder = metrics_dir.prepare_multiproc_dir(tmp_path / "prometheus")
    (folder / "gauge_livesum_4242.db").write_bytes(b"")
    assert metrics_dir.sweep(str(folder)) == ["4242"]
    assert list(folder.glob("*.db")) == []


def test_the_runner_sweeps_when_a_child_dies(tmp_path: Path) -> None:
    folder = metrics_dir.prepare_multiproc_dir(tmp_path / "prometheus")
    supervisor = Supervisor()
    died: list[int] = []
    try:
        child = supervisor.start(
            "short",
            [sys.executable, "-c", "from hub.lib import metrics; metrics.AGENTS_CONNECTED.inc()"],
            env=os.environ | {metrics_dir.MULTIPROC_ENV: str(folder)},
            cwd=REPO_ROOT,
        )
        wait_for(child.exited, timeout_s=60, what="the child to exit")
        # Its files carry its pid between its hostname and a random part.
        mine = f"-{child.pid}-"
        assert [p for p in folder.glob("gauge_livesum_*.db") if mine in p.name]
        supervisor.restart_exited(lambda line: None, died=died.append)
        supervisor.restart_exited(lambda line: None, died=died.append)  # heard once
        assert died == [child.pid]
        # What hub.runner's callback does with it (its restart may be running meanwhile).
        metrics_dir.sweep(str(folder), wait=True)
        assert [p.name for p in folder.glob("*.db") if mine in p.name] == []
        assert (folder / "counter_archive.db").exists()
    finally:
        supervisor.stop_all(timeout_s=10)
