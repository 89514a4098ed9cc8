"""Safe GPU claims on a host shared with other rental platforms.

A claim on GPU ``i`` is an exclusive ``flock`` on ``<lock_dir>/cloudgpu-gpu-<i>.lock`` (the
path other CloudGPU-compatible platforms use too), then a check that no foreign compute process
runs on the GPU, then compute mode ``EXCLUSIVE_PROCESS`` so nobody can start one while the
renter's container runs. ``flock`` (not a pid file) because the kernel drops it with the last
descriptor: an agent killed with ``-9`` leaves no stale claim behind.

The holder writes one JSON line into the lock file ({"agent_id", "pid", "lease_id", "since"})
so that a loser can say who holds the GPU. The file is never removed or replaced: a new inode
under the same name would let two processes "hold" the same GPU.

Blocking by design; the agent calls this through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from supplier_agent.gpu import COMPUTE_MODE_EXCLUSIVE_PROCESS, ComputeModeError, GpuQueryError, Nvml

log = logging.getLogger(__name__)

DEFAULT_LOCK_DIR = Path("/var/lock")
COMPUTE_MODE_POLICIES = ("require", "best-effort", "skip")
# A winner writes its name a moment after it gets the lock; a loser waits this long to read it.
HOLDER_INFO_WAIT_S = 0.5
MAX_INFO_BYTES = 4096


class ClaimRefused(Exception):
    """The GPUs cannot be claimed; ``reason`` is fit to show the renter."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ReserveResult:
    lease_id: str
    indices: tuple[int, ...]
    warnings: tuple[str, ...] = ()
    already_held: bool = False


@dataclass
class _GpuLock:
    index: int
    fd: int
    # True only when this claim switched the GPU to EXCLUSIVE_PROCESS: release undoes only that.
    exclusive_set: bool = False


def lock_path(lock_dir: Path, index: int) -> Path:
    return lock_dir / f"cloudgpu-gpu-{index}.lock"


def _indices_text(indices: Iterable[int]) -> str:
    return ", ".join(str(i) for i in indices)


class ClaimManager:
    """The GPU claims this agent holds, one set of GPUs per lease."""

    def __init__(
        self,
        lock_dir: Path,
        nvml: Nvml,
        compute_mode: str = "best-effort",
        owner: Mapping[str, Any] | None = None,
    ) -> None:
        if compute_mode not in COMPUTE_MODE_POLICIES:
            raise ValueError(
                f"compute_mode must be one of {', '.join(COMPUTE_MODE_POLICIES)}, "
                f"not {compute_mode!r}"
            )
        owner = owner or {}
        self.lock_dir = Path(lock_dir)
        self.nvml = nvml
        self.compute_mode = compute_mode
        self.agent_id = owner.get("agent_id")
        self.pid = int(owner.get("pid") or os.getpid())
        self._claims: dict[str, list[_GpuLock]] = {}
        # One claim operation at a time: the agent runs commands in worker threads.
        self._lock = threading.RLock()

    # --- queries ------------------------------------------------------------------------------

    def held(self) -> dict[str, tuple[int, ...]]:
        with self._lock:
            return {lease: tuple(g.index for g in locks) for lease, locks in self._claims.items()}

    def _lease_holding(self, index: int) -> str | None:
        for lease_id, locks in self._claims.items():
            if any(g.index == index for g in locks):
                return lease_id
        return None

    def holder_of(self, index: int) -> dict[str, Any] | None:
        """Who holds GPU ``index`` now: the lock file's info, ``{"pid": N}`` for a holder that
        left no (or stale) info, or ``None`` when the GPU is free."""
        with self._lock:
            lease_id = self._lease_holding(index)
            if lease_id is not None:
                return {"agent_id": self.agent_id, "pid": self.pid, "lease_id": lease_id}
        path = lock_path(self.lock_dir, index)
        if not path.exists():
            return None
        info = _read_info(path)
        holders = _flock_holders(path)
        if holders is None:  # no /proc/locks to check against: trust the file
            return info
        if not holders:
            # Free: any info left in the file is from a holder that was killed.
            return None
        if info is not None and info.get("pid") in holders:
            return info
        known = [pid for pid in holders if pid > 0]
        return {"pid": known[0] if known else None}

    # --- reserve ------------------------------------------------------------------------------

    def reserve(
        self, lease_id: str, indices: Sequence[int], own_pids: frozenset[int] = frozenset()
    ) -> ReserveResult:
        """Claim all of ``indices`` for ``lease_id`` or none of them (raises ``ClaimRefused``)."""
        wanted = tuple(sorted(set(indices)))
        if not wanted:
            raise ClaimRefused("no GPU requested")
        with self._lock:
            current = self._claims.get(lease_id)
            if current is not None:
                have = tuple(g.index for g in current)
                if have == wanted:  # a re-sent command: the claim is already in place
                    return ReserveResult(lease_id, wanted, already_held=True)
                raise ClaimRefused(
                    f"lease {lease_id} already holds GPU(s) {_indices_text(have)}; "
                    f"release it before reserving GPU(s) {_indices_text(wanted)}"
                )
            self._check_exist(wanted)
            taken: list[_GpuLock] = []
            try:
                # Ascending order: two agents wanting overlapping sets cannot deadlock (and
                # never block anyway: every lock attempt is non-blocking).
                for index in wanted:
                    taken.append(self._lock_gpu(index, lease_id))
                # Checked after locking: a foreign job that started before our lock (a platform
                # that does not lock) would otherwise share the GPU with the renter.
                for claim in taken:
                    self._check_no_foreign(claim.index, own_pids)
                warnings = [w for claim in taken for w in self._make_exclusive(claim, lease_id)]
                if any(claim.exclusive_set for claim in taken):
                    # A foreign process may have slipped in between the check and the mode
                    # change; exclusive mode would then lock the renter out, not it.
                    for claim in taken:
                        self._check_no_foreign(claim.index, own_pids)
            except BaseException:
                for warning in self._roll_back(taken):
                    log.warning("rolling back lease %s: %s", lease_id, warning)
                raise
            self._claims[lease_id] = taken
        for warning in warnings:
            log.warning("lease %s: %s", lease_id, warning)
        return ReserveResult(lease_id, wanted, warnings=tuple(warnings))

    def _check_exist(self, wanted: tuple[int, ...]) -> None:
        count = self.nvml.gpu_count()
        for index in wanted:
            if not 0 <= index < count:
                reason = f"GPU {index} does not exist on this host (it has {count})"
                if not self.nvml.available:
                    reason += f"; {self.nvml.unavailable_reason}"
                raise ClaimRefused(reason)
            other = self._lease_holding(index)
            if other is not None:
                raise ClaimRefused(self._held_text(index, self.holder_of(index)))

    def _lock_gpu(self, index: int, lease_id: str) -> _GpuLock:
        path = lock_path(self.lock_dir, index)
        fd = self._open(path, index)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ClaimRefused(self._busy_reason(index)) from None
        except OSError as exc:
            os.close(fd)
            raise ClaimRefused(f"could not lock GPU {index} ({path}): {exc.strerror}") from None
        # A lock file left by an earlier process of this same agent (killed, restarted) that
        # had set EXCLUSIVE_PROCESS: the mode is ours to restore on release, not an admin's.
        previous = _read_info(path) or {}
        inherited = previous.get("agent_id") == self.agent_id and bool(
            previous.get("exclusive_set")
        )
        claim = _GpuLock(index, fd, exclusive_set=inherited)
        self._write_info(claim, lease_id)
        return claim

    def _open(self, path: Path, index: int) -> int:
        flags = os.O_CLOEXEC | os.O_NOFOLLOW  # never follow a symlink planted in /var/lock
        try:
            self.lock_dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, flags | os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
                # Beat the umask: other platforms' agents, maybe other users, must open it too.
                os.fchmod(fd, 0o644)
            except FileExistsError:
                try:
                    fd = os.open(path, flags | os.O_RDWR)
                except PermissionError:
                    # Another user's file: flock works on a read-only descriptor; we just
                    # cannot leave our name in it.
                    fd = os.open(path, flags | os.O_RDONLY)
        except OSError as exc:
            raise ClaimRefused(
                f"could not open the lock file of GPU {index} ({path}): {exc.strerror}"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ClaimRefused(f"the lock file of GPU {index} ({path}) is not a regular file")
        return fd

    def _write_info(self, claim: _GpuLock, lease_id: str) -> None:
        info = {
            "agent_id": self.agent_id,
            "pid": self.pid,
            "lease_id": lease_id,
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "exclusive_set": claim.exclusive_set,
        }
        data = (json.dumps(info) + "\n").encode()
        try:
            # Write over, then cut: a reader never meets an empty file, only old or new bytes.
            os.pwrite(claim.fd, data, 0)
            os.ftruncate(claim.fd, len(data))
        except OSError as exc:
            log.debug("GPU %d: could not record the holder: %s", claim.index, exc)

    def _busy_reason(self, index: int) -> str:
        deadline = time.monotonic() + HOLDER_INFO_WAIT_S
        while True:
            holder = self.holder_of(index)
            if holder is None:
                return f"GPU {index} was locked by another process that has just let go; try again"
            if holder.get("lease_id") or time.monotonic() >= deadline:
                return self._held_text(index, holder)
            time.sleep(0.02)  # the holder locked but has not written its name yet

    @staticmethod
    def _held_text(index: int, holder: Mapping[str, Any] | None) -> str:
        holder = holder or {}
        pid = f" (pid {holder['pid']})" if holder.get("pid") else ""
        if holder.get("lease_id"):
            agent = holder.get("agent_id") or "unknown"
            return f"GPU {index} is held by lease {holder['lease_id']} of agent {agent}{pid}"
        return f"GPU {index} is locked by another process{pid}"

    def _check_no_foreign(self, index: int, own_pids: frozenset[int]) -> None:
        try:
            processes = self.nvml.compute_processes(index)
        except GpuQueryError as exc:
            # Unknown is not idle: refuse rather than share a GPU we cannot see into.
            raise ClaimRefused(
                f"could not list compute processes on GPU {index}: {exc.reason}"
            ) from None
        foreign = [p for p in processes if p.pid not in own_pids]
        if foreign:
            names = ", ".join(f"{p.name or 'unknown'} (pid {p.pid})" for p in foreign)
            raise ClaimRefused(f"GPU {index} is busy with foreign compute process(es): {names}")

    def _make_exclusive(self, claim: _GpuLock, lease_id: str) -> list[str]:
        if self.compute_mode == "skip":
            return []
        try:
            # Already exclusive (an admin's choice, which also lets an unprivileged agent run
            # with "require"): nothing to do, and nothing for release to undo.
            if self.nvml.get_compute_mode(claim.index) == COMPUTE_MODE_EXCLUSIVE_PROCESS:
                return []
            self.nvml.set_compute_mode(claim.index, exclusive=True)
        except ComputeModeError as exc:
            reason = f"could not set EXCLUSIVE_PROCESS on GPU {claim.index}: {exc.reason}"
            if self.compute_mode == "require":
                raise ClaimRefused(reason) from None
            return [reason]
        claim.exclusive_set = True
        # Recorded in the lock file so that start-up clean-up after a crash knows it was us.
        self._write_info(claim, lease_id)
        return []

    # --- release ------------------------------------------------------------------------------

    def release(self, lease_id: str) -> list[str]:
        """Restore compute modes and drop the locks of ``lease_id``; unknown lease: no-op."""
        with self._lock:
            taken = self._claims.pop(lease_id, None)
            if taken is None:
                return []
            warnings = self._roll_back(taken)
        for warning in warnings:
            log.warning("lease %s: %s", lease_id, warning)
        return warnings

    def _roll_back(self, taken: list[_GpuLock]) -> list[str]:
        warnings = []
        for claim in taken:
            restored = True
            if claim.exclusive_set:
                # Before the unlock: once the lock is gone another claimant may set its own mode.
                try:
                    self.nvml.set_compute_mode(claim.index, exclusive=False)
                except ComputeModeError as exc:
                    restored = False
                    warnings.append(
                        f"could not restore DEFAULT compute mode on GPU {claim.index}: {exc.reason}"
                    )
            if restored:
                # Keep the info otherwise: start-up clean-up uses it to retry the restore.
                with contextlib.suppress(OSError):
                    os.ftruncate(claim.fd, 0)
            os.close(claim.fd)  # drops the flock
        return warnings

    def restore_default_modes(self, indices: Iterable[int]) -> list[str]:
        """Start-up clean-up: put back DEFAULT on GPUs this agent left EXCLUSIVE_PROCESS when it
        died. Only GPUs whose lock is free and whose lock file says this agent set the mode are
        touched, so another platform's claim or an admin's setting is never undone."""
        if self.compute_mode == "skip" or not self.agent_id:
            return []
        warnings = []
        for index in sorted(set(indices)):
            with self._lock:
                if self._lease_holding(index) is not None:
                    continue
                path = lock_path(self.lock_dir, index)
                if not path.exists():
                    continue
                try:
                    fd = self._open(path, index)
                except ClaimRefused as exc:
                    warnings.append(exc.reason)
                    continue
                try:
                    warnings.extend(self._restore_locked(fd, path, index))
                finally:
                    os.close(fd)
        return warnings

    def _restore_locked(self, fd: int, path: Path, index: int) -> list[str]:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return []  # held by someone: its compute mode is its business
        info = _read_info(path)
        if not info or info.get("agent_id") != self.agent_id or not info.get("exclusive_set"):
            return []
        try:
            if self.nvml.get_compute_mode(index) == COMPUTE_MODE_EXCLUSIVE_PROCESS:
                self.nvml.set_compute_mode(index, exclusive=False)
        except ComputeModeError as exc:
            return [f"could not restore DEFAULT compute mode on GPU {index}: {exc.reason}"]
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        log.info("GPU %d: restored DEFAULT compute mode left by an earlier run", index)
        return []


def _read_info(path: Path) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_INFO_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        info = json.loads(data.split(b"\n", 1)[0])
    except ValueError:  # empty, half-written, or another platform's format
        return None
    return info if isinstance(info, dict) else None


def _flock_holders(path: Path) -> list[int] | None:
    """Pids holding a ``flock`` on ``path`` per ``/proc/locks`` (0: a pid we cannot see);
    ``None`` when that cannot be read."""
    try:
        st = os.stat(path)
        lines = Path("/proc/locks").read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return None
    exact: list[int] = []
    same_inode: list[int] = []
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 00:2d:1234 0 EOF"; "1: -> FLOCK ..." is a waiter.
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            pid = int(fields[4])
            if int(inode) != st.st_ino:
                continue
            device = (int(major, 16), int(minor, 16))
        except ValueError:
            continue
        # Overlay and some other file systems report a different device here than stat() does.
        target = exact if device == (os.major(st.st_dev), os.minor(st.st_dev)) else same_inode
        target.append(max(pid, 0))
    return exact or same_inode
