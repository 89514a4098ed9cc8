"""The agent's side of a hub rollout (protocol_upgrades.py): ``upgrade`` runs the supplier's own
``cloudgpu-agent upgrade`` from the installed prefix, ``rollback`` points the prefix back at the
version before it; both then restart the agent into what the prefix holds.

Only an agent that install.sh installed can do this: it runs as
``<prefix>/venv/bin/cloudgpu-agent``, ``<prefix>/venv`` a link to ``<prefix>/venvs/<version>``.
Under systemd the upgrade restarts the service itself (the unit's KillMode=process leaves the
upgrade process, in its own session, running to watch the new version and swap back if it does
not stay up). Without systemd the upgrade tries the new version with ``run --trial`` before it
switches, and this process then replaces itself with the new version (``exec``): containers
keep running and are adopted, as at any restart.

The upgrade's output goes to ``<state>/upgrade.log``, not a pipe: under systemd this process is
stopped mid-upgrade, and a pipe with no reader would kill the upgrade at its next line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from supplier_agent import __version__
from supplier_agent.config import AgentConfig
from supplier_agent.protocol import Message, Rollback, Upgrade, UpgradeStatus

log = logging.getLogger("cloudgpu.agent.upgrade")

LOG_NAME = "upgrade.log"
# The upgrade's own promise (upgrade.DEADLINE_S) plus its health window and a margin.
UPGRADE_TIMEOUT_S = 900
TAIL_LINES = 12
WAIT_POLL_S = 0.5


@dataclass(frozen=True)
class Installation:
    prefix: Path
    agent: Path  # <prefix>/venv/bin/cloudgpu-agent: whatever version the link points at
    systemd: bool


def installation(script: Path | None = None, environ: dict[str, str] | None = None) -> Installation:
    """Where install.sh put this agent: the ``<prefix>/venv/bin/cloudgpu-agent`` it was
    started as (the unit's ExecStart), unresolved, so the link, not what it points at, names
    the prefix. Raises RuntimeError saying why it cannot upgrade itself (run from a checkout,
    a pip install of its own, ...)."""
    script = Path(sys.argv[0]) if script is None else script
    env = os.environ if environ is None else environ
    bin_dir = script.parent
    if script.name != "cloudgpu-agent" or bin_dir.name != "bin" or bin_dir.parent.name != "venv":
        raise RuntimeError(
            f"this agent was started as {script}, not as an installer's "
            "<prefix>/venv/bin/cloudgpu-agent: upgrade it the way it was installed"
        )
    prefix = bin_dir.parent.parent.absolute()
    agent = prefix / "venv" / "bin" / "cloudgpu-agent"
    if not agent.exists():
        raise RuntimeError(f"no agent at {agent}")
    # systemd sets INVOCATION_ID for every unit it starts; the upgrade restarts the unit.
    return Installation(prefix, agent, systemd=bool(env.get("INVOCATION_ID")))


def health_window_s(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    try:
        return max(1.0, float(env.get("CLOUDGPU_ROLLOUT_HEALTH_WINDOW_S", "30")))
    except ValueError:
        return 30.0


def _spawn(argv: list[str], fd: int) -> subprocess.Popen[bytes]:
    """In its own session, output to ``fd``: a fork and exec, quick enough for the loop."""
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True
    )


async def _wait(process: subprocess.Popen[bytes], timeout_s: float) -> int | None:
    """The exit code, polled (no child watcher, no thread that would hold up a shutdown);
    None past the timeout."""
    deadline = time.monotonic() + timeout_s
    while (code := process.poll()) is None:
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(WAIT_POLL_S)
    return code


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError as exc:
        return f"(no upgrade log: {exc})"
    return "\n".join(lines[-TAIL_LINES:])[-1900:] or "(no output)"


class SelfUpgrader:
    """Runs one rollout command at a time for an Agent: ``send`` queues a message for the hub,
    ``restart`` asks the agent to stop and exec ``argv`` (the re-exec without systemd)."""

    def __init__(
        self,
        config: AgentConfig,
        send: Callable[[Message], None],
        restart: Callable[[list[str]], None],
    ) -> None:
        self.config = config
        self._send = send
        self._restart = restart
        self._busy = False

    def _status(self, message: Upgrade | Rollback, state: str, detail: str = "") -> None:
        self._send(
            UpgradeStatus(
                rollout_id=message.rollout_id,
                version=message.version,
                state=state,
                detail=detail[:1900],
            )
        )

    def _begin(self, message: Upgrade | Rollback) -> Installation | None:
        if self._busy:
            self._status(message, "refused", "an upgrade or rollback is already running")
            return None
        try:
            found = installation()
        except RuntimeError as exc:
            self._status(message, "refused", str(exc))
            return None
        self._busy = True
        return found

    def _restart_into(self, found: Installation) -> None:
        if found.systemd:
            # Not waited for: the restart stops this process (KillMode=process spares it).
            argv = ["systemctl", "restart", "cloudgpu-agent"]
            os.spawnvp(os.P_NOWAIT, argv[0], argv)  # noqa: S606
        else:
            self._restart([str(found.agent), *sys.argv[1:]])

    async def upgrade(self, message: Upgrade) -> None:
        if message.version == __version__:
            self._status(message, "switched", f"already runs version {__version__}")
            return
        found = self._begin(message)
        if found is None:
            return
        try:
            await self._upgrade(message, found)
        finally:
            self._busy = False

    async def _upgrade(self, message: Upgrade, found: Installation) -> None:
        logfile = self.config.state_dir / LOG_NAME
        argv = [
            str(found.agent),
            "upgrade",
            "--prefix",
            str(found.prefix),
            "--state",
            str(self.config.state_dir),
            "--expect-version",
            message.version,
            "--health-window",
            f"{health_window_s():g}",
        ]
        if not found.systemd:
            argv.append("--no-systemd")
        log.info("rollout %s: upgrading to %s", message.rollout_id, message.version)
        self._status(message, "started")
        fd = os.open(logfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            # subprocess, not asyncio's: when this agent stops (the upgrade restarts the unit),
            # asyncio kills the children of its transports at loop close, and this one must
            # live on to watch the new version and swap back. A Popen left behind kills nothing.
            process = _spawn(argv, fd)
        except OSError as exc:
            self._status(message, "failed", f"cannot run {argv[0]}: {exc}")
            return
        finally:
            os.close(fd)
        code = await _wait(process, UPGRADE_TIMEOUT_S)
        if code is None:
            # Its own session: the group is the upgrade and whatever it runs (pip, a trial).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = -1
        if code != 0:
            self._status(message, "failed", _tail(logfile))
            return
        self._status(message, "switched", _tail(logfile))
        if not found.systemd:
            self._restart_into(found)
        # Under systemd the upgrade has restarted the service: this process is on its way out.

    async def rollback(self, message: Rollback) -> None:
        if message.version == __version__:
            self._status(message, "rolled_back", f"already runs version {__version__}")
            return
        found = self._begin(message)
        if found is None:
            return
        try:
            from supplier_agent.upgrade import UpgradeError, rollback

            try:
                folder = await asyncio.to_thread(rollback, found.prefix, message.version)
            except (UpgradeError, OSError) as exc:
                self._status(message, "failed", str(exc))
                return
            log.info("rollout %s: rolled back to %s", message.rollout_id, message.version)
            self._status(message, "rolled_back", f"{found.prefix / 'venv'} -> {folder}")
            self._restart_into(found)
        finally:
            self._busy = False
