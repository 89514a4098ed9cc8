"""How much of the host's disk a rental holds: its files, and the files it deleted but keeps
open (disk_guard.py judges the figures).

Both walks run as root over folders and processes a renter controls, so neither follows a
name the renter could swap for a symlink between a check and a use: folders are opened
relative to their parent's descriptor with ``O_NOFOLLOW``, and a walk never leaves the device it
started on.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class Usage:
    bytes: int = 0
    files: int = 0
    seen: set[tuple[int, int]] = field(default_factory=set)  # hard-linked inodes counted

    def add(self, info: os.stat_result) -> None:
        if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
            key = (info.st_dev, info.st_ino)
            if key in self.seen:
                return
            self.seen.add(key)
        # Blocks, not the apparent size: a sparse file holds only what it wrote.
        self.bytes += info.st_blocks * 512


def measure_tree(path: str, usage: Usage, limit: int) -> bool:
    """Add the disk blocks of everything under ``path`` to ``usage``, stopping at the first
    file past ``limit``. False when ``path`` itself cannot be opened (gone, or not ours to
    read): the caller says so rather than count it as empty."""
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:
        return False
    device = os.fstat(top).st_dev
    stack = [top]
    try:
        while stack:
            folder = stack.pop()
            try:
                if not _scan(folder, device, usage, limit, stack):
                    return True
            finally:
                os.close(folder)
    finally:
        for fd in stack:
            os.close(fd)
    return True


def _scan(folder: int, device: int, usage: Usage, limit: int, stack: list[int]) -> bool:
    """One folder's entries; False once past the limit."""
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # gone meanwhile
            usage.files += 1
            if usage.files > limit:
                return False
            usage.add(info)
            if stat.S_ISDIR(info.st_mode) and info.st_dev == device:
                try:
                    stack.append(os.open(entry.name, _DIR_FLAGS, dir_fd=folder))
                except OSError:
                    continue  # swapped for a symlink, or gone: not followed
    return True


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def processes_by_pid_namespace() -> dict[str, list[int]]:
    """Every process of the host grouped by its PID namespace (a container's processes share
    its init's): one readlink a process, whatever the cgroup version or driver."""
    found: dict[str, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            namespace = pid_namespace(int(name))
            if namespace is not None:
                found.setdefault(namespace, []).append(int(name))
    return found


def add_deleted_open_files(pids: list[int], devices: set[int], usage: Usage) -> None:
    """Add the blocks of files these processes deleted but hold open, on ``devices`` (the
    container's root and Docker's disk: not its tmpfs or memfd files, which are memory). No
    folder lists them, yet they fill the disk until closed."""
    for pid in pids:
        folder = f"/proc/{pid}/fd"
        try:
            names = os.listdir(folder)
        except OSError:
            continue  # exited
        for name in names:
            link = f"{folder}/{name}"
            try:
                if not os.readlink(link).endswith(" (deleted)"):
                    continue
                info = os.stat(link)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_dev in devices:
                key = (info.st_dev, info.st_ino)
                if key not in usage.seen:  # open in several processes: once
                    usage.seen.add(key)
                    usage.bytes += info.st_blocks * 512


def written_bytes(pids: list[int]) -> int:
    """What these processes have written so far by their kernel counters (``write_bytes`` of
    ``/proc/<pid>/io``: counted when a page is dirtied, so before it reaches the disk)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/io", "rb") as handle:
                for line in handle:
                    if line.startswith(b"write_bytes:"):
                        total += int(line.split()[1])
                        break
        except (OSError, ValueError):
            continue  # exited, or not ours to read
    return total
