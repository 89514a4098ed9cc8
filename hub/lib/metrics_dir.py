"""The folder where prometheus_client's multiprocess mode keeps each process's values
(hub/lib/metrics.py), shared by every web, worker and beat process of a hub, on one machine or
across containers (docker-compose.yml's ``metrics`` volume).

Three things upstream leaves to the user, done here (the internals they touch are in
hub/lib/compat_prometheus.py):

* **Whose file is whose.** prometheus_client names a process's files by its pid, and
  containers each have their own pid numbers (pid 1 in every one): two processes would write
  one file. Each process names its files ``<hostname>-<pid>-<random>`` instead
  (:func:`process_identifier`), new in every process and after every fork, never reused, so a
  restarted container (same hostname, pid 1 again) does not take up its predecessor's file.
* **Who is alive.** Each process holds an exclusive ``flock`` on ``.locks/<identifier>`` for
  its whole life; the kernel drops it when the process ends, however it ends (SIGKILL and the
  OOM killer included), and a lock on a shared volume is seen from every container on the
  host. Nobody has to be told that a process died.
* **Dead processes' files.** :func:`sweep` (every scrape of ``/metrics``, each process's start,
  ``hub.runner`` when a child exits) finds writers whose lock is free, adds their counters and
  histograms into one ``*_archive.db`` file per kind, and deletes their files, gauges included
  (the hub's one gauge is ``livesum``: a dead web process's agents are not connected). The
  folder holds one set of files per live process plus the archive, however many processes
  came and went, and the totals never go down. Scrapes read under a shared lock on the folder
  and the sweep runs under the exclusive one, so a scrape never sees a dead process's values
  both in its own file and in the archive, or in neither.

Apart from the metrics themselves so that ``hub.runner``, which only prepares the folder, makes
no metric (its values would land in the folder too); prometheus_client is imported lazily.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
LOCKS = ".locks"  # one lock file per live writer, named by its identifier
FOLDER_LOCK = ".folder.lock"  # scrapes share it, the sweep takes it alone
ARCHIVE = "archive"  # the identifier of dead writers' added-up values
_TMP = ".tmp-"  # not yet in place: ignored by the sweep and the collector


def prepare_multiproc_dir(path: Path) -> Path:
    """An empty folder for the multiprocess values: files of a previous run's processes would
    otherwise be added to this run's counters (and their live gauges never go away)."""
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True, mode=0o700)
    return path


def multiproc_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


# --- this process's identifier and its lock ----------------------------------------------------


class _Me:
    pid = -1
    identifier = ""
    lock_fd = -1


def _hostname() -> str:
    # "_" separates the parts of prometheus_client's file names: never in an identifier.
    return re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:63] or "host"


def process_identifier() -> str:
    """This process's identifier for its metric files, made (with its lock taken) the first
    time it is asked for in a process. Called on every metric write: one ``getpid``, as
    prometheus_client's own default."""
    pid = os.getpid()
    if pid != _Me.pid:
        _claim(pid)
    return _Me.identifier


def _claim(pid: int) -> None:
    folder = multiproc_dir()
    if folder is None:
        raise RuntimeError(f"{MULTIPROC_ENV} is not set")
    locks = os.path.join(folder, LOCKS)
    os.makedirs(locks, mode=0o700, exist_ok=True)
    identifier = f"{_hostname()}-{pid}-{secrets.token_hex(4)}"
    # Locked before it has its name: a sweep never sees this writer's lock file unlocked.
    temporary = os.path.join(locks, f"{_TMP}{identifier}")
    fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(temporary, os.path.join(locks, identifier))
    _forget_parent()
    _Me.pid, _Me.identifier, _Me.lock_fd = pid, identifier, fd


def _forget_parent() -> None:
    """In a forked child: close the parent's lock (the parent still holds it; the child's copy
    would keep a dead parent looking alive)."""
    if _Me.lock_fd >= 0 and _Me.pid != os.getpid():
        os.close(_Me.lock_fd)
        _Me.pid, _Me.identifier, _Me.lock_fd = -1, "", -1


os.register_at_fork(after_in_child=_forget_parent)


def use_shared_folder() -> None:
    """With a multiprocess folder set, name this process's files by :func:`process_identifier`.
    Call before the first metric is made (hub/lib/metrics.py does, at its top)."""
    folder = multiproc_dir()
    if folder is None:
        return
    from hub.lib import compat_prometheus

    os.makedirs(folder, mode=0o700, exist_ok=True)
    compat_prometheus.use_process_identifier(process_identifier)


# --- dead writers --------------------------------------------------------------------------------


@contextmanager
def _folder_lock(folder: str, operation: int) -> Iterator[bool]:
    fd = os.open(os.path.join(folder, FOLDER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _lock_if_dead(folder: str, identifier: str) -> int | None:
    """The writer's lock file, locked by us (an fd), when its writer is gone; -1 when it has
    no lock file (gone too); None while the writer lives."""
    try:
        fd = os.open(os.path.join(folder, LOCKS, identifier), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def sweep(folder: str, *, wait: bool = False) -> list[str]:
    """Add dead writers' counters and histograms into the archive and delete their files;
    returns their identifiers. Without ``wait`` it does nothing while another sweep or a
    scrape holds the folder (the next one sweeps)."""
    from hub.lib import compat_prometheus

    if not os.path.isdir(folder):
        return []
    with _folder_lock(folder, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)) as held:
        if not held:
            return []
        files: dict[str, list[str]] = {}
        for name in os.listdir(folder):
            identifier = compat_prometheus.identifier_of(name)
            if identifier is not None and identifier != ARCHIVE and not name.startswith(_TMP):
                files.setdefault(identifier, []).append(name)
        locks = os.path.join(folder, LOCKS)
        if os.path.isdir(locks):
            for name in os.listdir(locks):
                if not name.startswith("."):
                    files.setdefault(name, [])
        dead: dict[str, int] = {}
        try:
            for identifier in files:
                fd = _lock_if_dead(folder, identifier)
                if fd is not None:
                    dead[identifier] = fd
            if not dead:
                return []
            by_kind: dict[str, list[str]] = {}
            for identifier in dead:
                for name in files[identifier]:
                    by_kind.setdefault(compat_prometheus.kind_of(name), []).append(name)
            for kind, names in by_kind.items():
                if kind == "gauge":
                    continue  # a dead process's gauges say nothing now
                archive = compat_prometheus.file_name(kind, ARCHIVE)
                sources = [os.path.join(folder, n) for n in names]
                if os.path.exists(os.path.join(folder, archive)):
                    sources.append(os.path.join(folder, archive))
                temporary = os.path.join(folder, f"{_TMP}{archive}")
                if os.path.exists(temporary):
                    os.remove(temporary)  # a sweep killed half-way
                compat_prometheus.write_merged(sources, temporary)
                os.replace(temporary, os.path.join(folder, archive))
            for identifier in dead:
                for name in files[identifier]:
                    os.remove(os.path.join(folder, name))
                if dead[identifier] >= 0:
                    os.remove(os.path.join(locks, identifier))
            return sorted(dead)
        finally:
            for fd in dead.values():
                if fd >= 0:
                    os.close(fd)


def registry() -> Any:
    """A registry holding every live and dead process's values in ``folder`` (a scrape)."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    folder = multiproc_dir()
    if folder is None:
        raise RuntimeError(f"{MULTIPROC_ENV} is not set")
    shared: str = folder

    class SharedFolderCollector(MultiProcessCollector):
        def collect(self) -> Any:
            sweep(shared)  # dead web processes' agents leave the gauge before it is read
            with _folder_lock(shared, fcntl.LOCK_SH):
                return super().collect()  # type: ignore[no-untyped-call]

    registry = CollectorRegistry()
    SharedFolderCollector(registry, shared)  # type: ignore[no-untyped-call]
    return registry
