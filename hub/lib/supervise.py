"""Start child processes so that none can outlive the dev runner, restart the ones that die,
and stop them in order."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_PR_SET_PDEATHSIG = 1


def _die_with_parent(signum: int) -> Callable[[], None]:
    def preexec() -> None:
        # Runs in the child between fork and exec: if the runner is SIGKILLed and cannot clean
        # up, the kernel still sends each direct child its own stop signal (SIGINT, Postgres'
        # fast shutdown, rather than SIGTERM, which waits for clients). Linux only.
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    return preexec


@dataclass
class Spec:
    """How a child was started, so that it can be started again the same way."""

    argv: list[str]
    env: dict[str, str] | None
    log_path: Path | None
    user: int | None
    group: int | None
    stop_signal: int
    cwd: Path | None


# A child that dies is started again after 1 s, doubling up to 30 s while it keeps dying within
# a minute of its start; one that ran longer starts from 1 s again.
RESTART_BASE_S = 1.0
RESTART_CAP_S = 30.0
STABLE_AFTER_S = 60.0


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    stop_signal: int
    log: IO[bytes] | None = field(default=None, repr=False)
    spec: Spec | None = field(default=None, repr=False)
    started_at: float = field(default_factory=time.monotonic)
    quick_deaths: int = 0  # in a row, each within STABLE_AFTER_S of its start
    restart_at: float | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def exited(self) -> bool:
        return self.process.poll() is not None


class Supervisor:
    """Owns every long-running child of the runner.

    Each child gets its own session (so a terminal's Ctrl-C reaches only the runner, which then
    stops children in reverse start order: web before the database it uses) and its own process
    group (so grandchildren such as Celery's pool or Postgres backends go with it).
    """

    def __init__(self) -> None:
        self.children: list[Child] = []

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        user: int | None = None,
        group: int | None = None,
        stop_signal: int = signal.SIGTERM,
        cwd: Path | None = None,
    ) -> Child:
        spec = Spec(list(argv), env, log_path, user, group, stop_signal, cwd)
        child = _spawn(name, spec)
        self.children.append(child)
        return child

    def restart_exited(
        self, report: Callable[[str], None], died: Callable[[int], None] | None = None
    ) -> None:
        """Start again, with backoff, every child that has died (call it every so often);
        ``died`` hears each dead child's pid once."""
        now = time.monotonic()
        for position, child in enumerate(self.children):
            if not child.exited() or child.spec is None:
                continue
            if child.restart_at is None:
                if died is not None:
                    died(child.pid)
                quick = now - child.started_at < STABLE_AFTER_S
                child.quick_deaths = child.quick_deaths + 1 if quick else 0
                delay = min(RESTART_CAP_S, RESTART_BASE_S * 2 ** max(0, child.quick_deaths - 1))
                child.restart_at = now + delay
                report(
                    f"{child.name} exited with status {child.process.returncode}; "
                    f"restarting it in {delay:.0f} s"
                )
            elif now >= child.restart_at:
                # Whatever the dead child left in its group (a pool worker) goes first.
                _kill_group(child.pid)
                if child.log is not None:
                    child.log.close()
                again = _spawn(child.name, child.spec)
                again.quick_deaths = child.quick_deaths
                self.children[position] = again
                report(f"{child.name} restarted (pid {again.pid})")

    def first_exited(self) -> Child | None:
        return next((child for child in self.children if child.exited()), None)

    def stop_all(self, timeout_s: float = 30.0) -> None:
        for child in reversed(self.children):
            self._stop(child, timeout_s)
        self.children.clear()

    @staticmethod
    def _stop(child: Child, timeout_s: float) -> None:
        if not child.exited():
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(child.stop_signal)
            try:
                child.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        # Whatever the child left behind in its group (a pool worker that missed the memo).
        _kill_group(child.pid)
        if child.log is not None:
            child.log.close()


def _spawn(name: str, spec: Spec) -> Child:
    log = open(spec.log_path, "ab") if spec.log_path is not None else None  # noqa: SIM115 - closed in stop_all
    process = subprocess.Popen(
        spec.argv,
        env=spec.env,
        cwd=spec.cwd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT if log is not None else None,
        start_new_session=True,
        preexec_fn=_die_with_parent(spec.stop_signal),  # the runner is single-threaded here
        user=spec.user,
        group=spec.group,
        extra_groups=[] if spec.user is not None else None,
    )
    return Child(name, process, spec.stop_signal, log, spec)


def _kill_group(pgid: int) -> None:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)  # the group empties once the kernel has reaped its members
