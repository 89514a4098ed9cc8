"""The prometheus_client internals hub.lib.compat_prometheus (and through it the shared metrics
folder, hub/lib/metrics_dir.py) relies on.

A failure names what changed; re-check hub/lib/compat_prometheus.py and hub/lib/metrics_dir.py
when the prometheus-client pin (requirements/agent.txt) moves. Everything here runs in this
process, on a folder of its own, with ``values.ValueClass`` put back afterwards.
"""

from __future__ import annotations

import inspect
from importlib.metadata import version
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families

from hub.lib import compat_prometheus


def _recheck(what: str) -> str:
    return (
        f"prometheus-client {version('prometheus-client')}: {what} changed; re-check "
        "hub/lib/compat_prometheus.py and hub/lib/metrics_dir.py"
    )


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    # Whatever the test installs is undone: later tests' metrics stay in-process.
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)
    return tmp_path


def _collected(folder: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, str(folder))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_multi_process_value_still_takes_a_process_identifier() -> None:
    parameters = inspect.signature(values.MultiProcessValue).parameters
    assert list(parameters) == ["process_identifier"], _recheck("MultiProcessValue's signature")


def test_metrics_made_after_the_swap_name_their_files_by_the_identifier(folder: Path) -> None:
    who = ["box-1-aa"]
    compat_prometheus.use_process_identifier(lambda: who[0])
    counter = Counter("compat_c", "c", ["kind"], registry=None)
    gauge = Gauge("compat_g", "g", multiprocess_mode="livesum", registry=None)
    counter.labels("x").inc(2)
    gauge.inc()
    names = sorted(p.name for p in folder.glob("*.db"))
    assert names == ["counter_box-1-aa.db", "gauge_livesum_box-1-aa.db"], _recheck(
        "values.ValueClass as the metrics' value class, or the files' names"
    )
    assert [compat_prometheus.identifier_of(n) for n in names] == ["box-1-aa", "box-1-aa"]
    assert [compat_prometheus.kind_of(n) for n in names] == ["counter", "gauge"]
    # The identifier is asked again on every write: a new one (a fork) means new files.
    who[0] = "box-2-bb"
    counter.labels("x").inc(3)
    assert (folder / "counter_box-2-bb.db").exists(), _recheck("MultiProcessValue's fork check")
    assert _collected(folder)[("compat_c_total", (("kind", "x"),))] == 5
    # mark_process_dead still finds live gauges by the same name.
    mark_process_dead("box-1-aa", str(folder))  # type: ignore[no-untyped-call]
    assert not (folder / "gauge_livesum_box-1-aa.db").exists(), _recheck("mark_process_dead")


def test_merged_files_read_back_as_the_sum_of_their_sources(folder: Path) -> None:
    for who, amount in (("a-1-x", 2.0), ("b-1-y", 3.0)):
        compat_prometheus.use_process_identifier(lambda who=who: who)
        Counter("compat_m", "m", ["kind"], registry=None).labels("k").inc(amount)
        Histogram("compat_h", "h", buckets=(1.0, 5.0), registry=None).observe(amount)
    before = _collected(folder)
    for kind in ("counter", "histogram"):
        sources = [str(p) for p in folder.glob(f"{kind}_*.db")]
        target = folder / compat_prometheus.file_name(kind, "archive")
        compat_prometheus.write_merged(sources, str(target))
        for source in sources:
            Path(source).unlink()
    assert sorted(p.name for p in folder.glob("*.db")) == [
        "counter_archive.db",
        "histogram_archive.db",
    ]
    after = _collected(folder)
    assert after == before, _recheck("MultiProcessCollector.merge or the mmap file format")
    assert after[("compat_m_total", (("kind", "k"),))] == 5
    assert after[("compat_h_bucket", (("le", "5.0"),))] == 2
    assert after[("compat_h_count", ())] == 2


def test_identifier_of_reads_only_multiprocess_files() -> None:
    assert compat_prometheus.identifier_of("histogram_h-7-01.db") == "h-7-01"
    assert compat_prometheus.identifier_of("gauge_all_h-7-01.db") == "h-7-01"
    assert compat_prometheus.identifier_of(".folder.lock") is None
    assert compat_prometheus.identifier_of("counter_a_b_c.db") is None
