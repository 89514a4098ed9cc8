"""Which process holds which Redis connection: the server's CLIENT LIST (name, last command,
age) matched to processes by the client's local address in the operating system's socket table.

Used by the benchmarks (bench/reconnect.py, bench/heartbeats.py) and by
tests/e2e/test_redis_connections.py, so both count the same way. Redis' own list is the source,
so a connection counts whether or not the hub named it (CLIENT SETNAME).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import psutil
import redis


def clients_by_process(url: str, pids: Mapping[str, int]) -> dict[str, list[dict[str, Any]]]:
    """CLIENT LIST entries of each named process; ``<name>-child-<pid>`` for its children (a
    Celery worker's pool). Processes that hold none are listed with none."""
    names: dict[int, str] = {}
    for name, pid in pids.items():
        names[pid] = name
        with contextlib.suppress(psutil.NoSuchProcess):
            for child in psutil.Process(pid).children(recursive=True):
                names.setdefault(child.pid, f"{name}-child-{child.pid}")
    port = urlsplit(url).port or 6379
    owner: dict[tuple[str, int], str] = {}
    for pid, name in names.items():
        with contextlib.suppress(psutil.NoSuchProcess):
            for conn in psutil.Process(pid).net_connections(kind="tcp"):
                if conn.raddr and conn.raddr.port == port:
                    owner[(conn.laddr.ip, conn.laddr.port)] = name
    client = redis.Redis.from_url(url)
    try:
        entries = client.client_list()
    finally:
        client.close()  # type: ignore[no-untyped-call]
    found: dict[str, list[dict[str, Any]]] = {name: [] for name in names.values()}
    for entry in entries:
        host, _, local_port = str(entry["addr"]).rpartition(":")
        name = owner.get((host.strip("[]"), int(local_port)))
        if name is not None:
            found[name].append(entry)
    return found


def counts(found: Mapping[str, list[dict[str, Any]]]) -> dict[str, int]:
    return {name: len(entries) for name, entries in found.items()}


def describe(found: Mapping[str, list[dict[str, Any]]]) -> str:
    """One line per process: its connections' names, last commands and ages (for messages)."""
    lines = []
    for name, entries in sorted(found.items()):
        what = ", ".join(
            f"{e.get('name') or '-'} ({e.get('cmd')}, {e.get('age')} s)" for e in entries
        )
        lines.append(f"{name}: {len(entries)}: {what}")
    return "\n".join(lines)
