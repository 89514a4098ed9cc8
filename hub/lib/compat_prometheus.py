"""The prometheus_client (``prometheus-client==0.26.0``, requirements/agent.txt, which
requirements/hub.txt includes) internals the hub's shared metrics folder relies on
(hub/lib/metrics_dir.py). A release that changes one of them fails
tests/hub/test_compat_prometheus.py, whose messages name what to re-check here.

``values.ValueClass`` (a module global, replaced) and
``values.MultiProcessValue(process_identifier)``
    Every metric reads ``values.ValueClass`` when it is made; in multiprocess mode that is
    ``MultiProcessValue()``, whose files are named by ``os.getpid()``. Processes in different
    containers share pid numbers (pid 1 in each), so two of them sharing a folder would write
    one file at once. :func:`use_process_identifier` makes the value class name files by the
    hub's own identifier instead. ``process_identifier`` is a documented parameter of
    ``MultiProcessValue`` ("at your own risk"), but there is no public way to install the
    result: the module global is replaced before the first metric is made. Upstream: the
    parameter came with https://github.com/prometheus/client_python/pull/387 (uWSGI workers);
    no issue offers another way to choose it.

The file names ``<type>_<id>.db`` and ``gauge_<mode>_<id>.db`` (how ``MultiProcessValue`` names
them and ``MultiProcessCollector`` and ``mark_process_dead`` parse them)
    :func:`identifier_of` reads a file's writer back from its name, which is why an identifier
    may hold no ``_``.

``mmap_dict.MmapedDict`` and ``mmap_dict.mmap_key`` (module internals) with
``MultiProcessCollector.merge(files, accumulate=False)`` (public, its docstring's own use)
    :func:`write_merged` writes dead processes' counters and histograms, added up, into one
    file of the same format, so the folder holds one file per live process plus one archive
    instead of one per process that ever ran. Upstream refused compaction in the library
    because nothing told a dead pid from a reused one and nothing locked the folder
    (https://github.com/prometheus/client_python/issues/204, /367, /443, the unmerged
    https://github.com/prometheus/client_python/pull/518); metrics_dir answers both (identifiers
    never reused, a lock per live process, a folder lock that scrapes share). Merging drops
    timestamps (https://github.com/prometheus/client_python/issues/1056, open), which only
    ``mostrecent`` gauges use; the hub has none, and dead processes' gauges are dropped, not
    merged.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from prometheus_client import values
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector


def use_process_identifier(identify: Callable[[], str]) -> None:
    """Name this process's multiprocess files by ``identify()`` (called on every write, and
    again after a fork: it must be cheap and differ between processes running at once).
    Effective only for metrics made after this call."""
    values.ValueClass = values.MultiProcessValue(identify)  # type: ignore[no-untyped-call]


def identifier_of(filename: str) -> str | None:
    """The writer's identifier in a multiprocess file's name, None for any other file."""
    if not filename.endswith(".db"):
        return None
    parts = filename[: -len(".db")].split("_")
    if parts[0] == "gauge":
        return parts[2] if len(parts) == 3 else None
    return parts[1] if len(parts) == 2 else None


def kind_of(filename: str) -> str:
    """``counter``, ``histogram``, ``summary`` or ``gauge`` (the file name's first part)."""
    return filename.split("_", 1)[0]


def file_name(kind: str, identifier: str) -> str:
    """A counter's, histogram's or summary's file for ``identifier``."""
    return f"{kind}_{identifier}.db"


def write_merged(sources: Iterable[str], target: str) -> None:
    """Add up the counters, histograms or summaries in ``sources`` (one kind) into a new file
    ``target`` in the same format, which the collector reads like any process's."""
    merged = MultiProcessCollector.merge(list(sources), accumulate=False)  # type: ignore[no-untyped-call]
    out = MmapedDict(target)  # type: ignore[no-untyped-call]
    try:
        for metric in merged:
            for sample in metric.samples:
                names = list(sample.labels)
                key = mmap_key(
                    metric.name,
                    sample.name,
                    names,
                    [sample.labels[n] for n in names],
                    metric.documentation,
                )
                out.write_value(key, sample.value, 0.0)  # type: ignore[no-untyped-call]
    finally:
        out.close()  # type: ignore[no-untyped-call]
    os.chmod(target, 0o600)
