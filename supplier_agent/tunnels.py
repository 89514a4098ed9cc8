"""Renters' tunnels: one ``ssh -R`` per lease to the hub's gateway, with a per-lease key.

OpenSSH does the tunnelling; this module only keeps it alive. The gateway's sshd lets a lease's
key listen on the ports the hub allocated and nothing else, so a port is reported ``up`` only
once the gateway said yes to its forward (ssh -v prints that), never merely because ssh runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import re
import shutil
import signal
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supplier_agent.protocol import TunnelSpec, TunnelState
from supplier_agent.runtime import CommandFailed

log = logging.getLogger("cloudgpu.tunnels")

HOST_KEY_ALIAS = "cloudgpu-gateway"
KEY_NAME = "id_ed25519"
# A key made ahead of the next reserve (key_for_new_lease), beside the leases' folders.
SPARE_FOLDER = "spare"
BACKOFF_BASE_S = 1.0  # the first attempt is refused until the hub has recorded the key
BACKOFF_CAP_S = 30.0
STABLE_TUNNEL_S = 60.0  # a tunnel up this long was healthy: its next failure backs off afresh
TERM_GRACE_S = 3.0
TOOL_TIMEOUT_S = 60.0  # ssh-keygen takes ~10 ms; a minute is a hung tool
MAX_DETAIL = 512  # tunnel_state.detail in the protocol
MISSING_SSH = (
    "this host cannot open tunnels: the OpenSSH client ({tool}) is not installed; "
    "apt install openssh-client"
)

_FORWARD_REPLY = re.compile(r"remote forward (success|failure) for: listen (?:\S*:)?(\d+),")
# ssh's own error lines, most telling first; anything else falls back to the last plain line.
_DETAILS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (
        re.compile(r"Host key verification failed"),
        "Host key verification failed: the gateway's host key is not one the hub announced",
    ),
    (re.compile(r"Permission denied \([^)]*\)"), None),
    (re.compile(r"remote port forwarding failed for listen port \d+"), None),
    (re.compile(r"connect to host \S+ port \d+: .*"), None),
    (re.compile(r"Could not resolve hostname .*"), None),
    (re.compile(r"Timeout, server \S+ not responding"), None),
    (re.compile(r"Connection (?:closed|reset|timed out)\b.*"), None),
)
# Non-debug lines that say nothing about why ssh ended.
_NOISE = ("OpenSSH_", "Authenticated to ", "Transferred: ", "Bytes per second", "@")

Report = Callable[[TunnelState], None]


class TunnelUnavailable(CommandFailed):
    """This host cannot open tunnels at all (no OpenSSH client)."""


def tunnel_tools_present() -> bool:
    return all(shutil.which(tool) is not None for tool in ("ssh", "ssh-keygen"))


def require_tools() -> None:
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            raise TunnelUnavailable(MISSING_SSH.format(tool=tool))


def spec_to_dict(spec: TunnelSpec) -> dict[str, Any]:
    """The spec as plain JSON for claims.json; ``TunnelSpec.parse`` reads it back."""
    return {
        "host": spec.host,
        "port": spec.port,
        "user": spec.user,
        "host_keys": list(spec.host_keys),
        "forwards": [{"port": f.port, "listen_port": f.listen_port} for f in spec.forwards],
    }


def ssh_argv(
    spec: TunnelSpec, key: Path, known_hosts: Path, host_ports: Mapping[int, int]
) -> list[str]:
    argv = ["ssh", "-F", "/dev/null", "-v", "-N", "-T", "-i", str(key)]
    for option in (
        "BatchMode=yes",
        "IdentitiesOnly=yes",
        "IdentityAgent=none",
        # One alias for every gateway address: the hub's host keys are all that is trusted.
        f"HostKeyAlias={HOST_KEY_ALIAS}",
        f"UserKnownHostsFile={known_hosts}",
        "GlobalKnownHostsFile=/dev/null",
        "StrictHostKeyChecking=yes",
        # A refused forward must end ssh: a half-working tunnel would look alive forever.
        "ExitOnForwardFailure=yes",
        "ServerAliveInterval=15",
        "ServerAliveCountMax=3",
        "ConnectTimeout=15",
    ):
        argv += ["-o", option]
    argv += ["-p", str(spec.port), "-l", spec.user]
    for forward in spec.forwards:
        local = host_ports[forward.port]
        argv += ["-R", f"127.0.0.1:{forward.listen_port}:127.0.0.1:{local}"]
    argv.append(spec.host)
    return argv


def exit_detail(lines: list[str], returncode: int) -> str:
    """A short reason for the renter's dashboard from ssh's non-debug stderr lines."""
    for pattern, fixed in _DETAILS:
        for line in lines:
            match = pattern.search(line)
            if match:
                return (fixed or match.group(0).rstrip("."))[:MAX_DETAIL]
    plain = [line for line in lines if not line.startswith(_NOISE)]
    if plain:
        return plain[-1].removeprefix("ssh: ").removeprefix("Error: ")[:MAX_DETAIL]
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"ssh was killed by signal {signal.Signals(-returncode).name}"
        return f"ssh was killed by signal {-returncode}"
    return f"ssh exited with status {returncode}"


@dataclass
class _Tunnel:
    lease_id: str
    spec: TunnelSpec
    host_ports: dict[int, int]  # container port -> host port on 127.0.0.1
    task: asyncio.Task[None] | None = None
    listen_to_port: dict[int, int] = field(default_factory=dict)
    # Set on every state change of one of its ports: wait_up() waits on it.
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class TunnelManager:
    """One supervisor task (one ssh process) per lease; every state change goes to ``report``."""

    def __init__(self, state_dir: Path, report: Report) -> None:
        self.root = state_dir / "tunnels"
        self._report = report
        self._tunnels: dict[str, _Tunnel] = {}
        self._states: dict[tuple[str, int], TunnelState] = {}

    # --- keys -----------------------------------------------------------------------------

    def lease_dir(self, lease_id: str) -> Path:
        return self.root / lease_id  # lease ids are UUIDs (protocol-checked): path-safe

    async def ensure_key(self, lease_id: str) -> str:
        """The lease's public key line, made once: the hub registered it, so a restarted agent
        must keep using the same key."""
        require_tools()
        folder = self.lease_dir(lease_id)
        for path in (self.root, folder):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            path.chmod(0o700)
        key = folder / KEY_NAME
        public = key.with_name(KEY_NAME + ".pub")
        if key.exists():
            if not public.exists():
                out = await _run_tool("ssh-keygen", "-y", "-f", str(key))
                public.write_text(out)
            return public.read_text().strip()
        # Generate beside and rename: a crash mid-way must not leave half a key to reuse.
        fresh = folder / (KEY_NAME + ".new")
        for stale in (fresh, fresh.with_name(fresh.name + ".pub")):
            stale.unlink(missing_ok=True)
        comment = f"cloudgpu-lease-{lease_id}"
        await _run_tool(
            "ssh-keygen", "-t", "ed25519", "-N", "", "-q", "-C", comment, "-f", str(fresh)
        )
        fresh.chmod(0o600)
        fresh.with_name(fresh.name + ".pub").replace(public)
        fresh.replace(key)
        return public.read_text().strip()

    async def key_for_new_lease(self, lease_id: str) -> str:
        """The lease's public key line at reserve time, from the spare key made beforehand
        when there is one (a rename, where ssh-keygen costs ~10 ms on the rent's path); call
        ``refill_spare`` after, off that path."""
        folder = self.lease_dir(lease_id)
        spare = self.root / SPARE_FOLDER
        if not (folder / KEY_NAME).exists() and (spare / KEY_NAME).exists():
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                # Public half first: a key without its .pub is rebuilt by ensure_key; the
                # reverse would leave a .pub without its key.
                (spare / (KEY_NAME + ".pub")).replace(folder / (KEY_NAME + ".pub"))
                (spare / KEY_NAME).replace(folder / KEY_NAME)
            except FileNotFoundError:  # another reserve took it first
                pass
        return await self.ensure_key(lease_id)

    async def refill_spare(self) -> None:
        """Make the next lease's key ahead of time (see ``key_for_new_lease``)."""
        if not (self.root / SPARE_FOLDER / KEY_NAME).exists():
            await self.ensure_key(SPARE_FOLDER)

    def forget_keys(self, keep: set[str]) -> None:
        """Remove key folders of leases no longer held (a release missed while stopped)."""
        if not self.root.is_dir():
            return
        for folder in self.root.iterdir():
            if folder.name not in keep | {SPARE_FOLDER} and folder.name not in self._tunnels:
                shutil.rmtree(folder, ignore_errors=True)

    # --- supervisors ----------------------------------------------------------------------

    def current_states(self) -> list[TunnelState]:
        """Every port's latest state, to re-send after a reconnect (the hub may have restarted)."""
        return list(self._states.values())

    async def start(self, lease_id: str, spec: TunnelSpec, host_ports: Mapping[str, int]) -> None:
        """(Re)start the lease's supervisor; ``host_ports`` is the claim's container -> host map."""
        require_tools()
        ports = {int(port): int(host) for port, host in host_ports.items()}
        missing = [f.port for f in spec.forwards if f.port not in ports]
        if missing:
            raise CommandFailed(f"tunnel forwards port(s) {missing} the container does not publish")
        await self.stop(lease_id, forget_key=False)
        folder = self.lease_dir(lease_id)
        if not (folder / KEY_NAME).exists():
            raise CommandFailed(f"lease {lease_id} has no tunnel key here (it was removed)")
        known_hosts = folder / "known_hosts"
        known_hosts.write_text("".join(f"{HOST_KEY_ALIAS} {key}\n" for key in spec.host_keys))
        _kill_stale_ssh(folder)
        tunnel = _Tunnel(
            lease_id, spec, ports, listen_to_port={f.listen_port: f.port for f in spec.forwards}
        )
        tunnel.task = asyncio.create_task(self._supervise(tunnel), name=f"tunnel-{lease_id}")
        self._tunnels[lease_id] = tunnel

    async def wait_up(self, lease_id: str, timeout_s: float) -> dict[int, str]:
        """Wait until every forward of the lease's tunnel is up, at most ``timeout_s``; the
        ports still not up then, with why (empty: all up). Seed 002: a rental is running once
        the way in works, or it says why not."""
        tunnel = self._tunnels.get(lease_id)
        if tunnel is None:
            return {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            down = {
                f.port: (
                    self._states[(lease_id, f.port)].detail
                    if (lease_id, f.port) in self._states
                    else "the gateway has not answered yet"
                )
                for f in tunnel.spec.forwards
                if getattr(self._states.get((lease_id, f.port)), "state", None) != "up"
            }
            left = deadline - loop.time()
            if not down or left <= 0:
                return down
            tunnel.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(tunnel.changed.wait(), left)

    async def stop(self, lease_id: str, *, forget_key: bool = True) -> None:
        """End the lease's ssh (its whole process group) and supervisor; ``forget_key`` also
        deletes the key folder (the lease is over; keep it when only the agent stops)."""
        tunnel = self._tunnels.pop(lease_id, None)
        if tunnel is not None and tunnel.task is not None:
            tunnel.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await tunnel.task
        for key in [key for key in self._states if key[0] == lease_id]:
            del self._states[key]
        if forget_key:
            shutil.rmtree(self.lease_dir(lease_id), ignore_errors=True)

    async def close(self) -> None:
        """Agent shutdown: stop every ssh but keep the keys, the claims outlive the process."""
        for lease_id in list(self._tunnels):
            await self.stop(lease_id, forget_key=False)

    def _set(self, tunnel: _Tunnel, port: int, state: str, detail: str = "") -> None:
        message = TunnelState(tunnel.lease_id, port, state, detail[:MAX_DETAIL])
        if self._states.get((tunnel.lease_id, port)) == message:
            return  # a retry failing the same way again is not news to the hub
        self._states[(tunnel.lease_id, port)] = message
        tunnel.changed.set()
        if state == "up":
            log.info("tunnel for lease %s port %d is up", tunnel.lease_id, port)
        else:
            log.warning("tunnel for lease %s port %d is down: %s", tunnel.lease_id, port, detail)
        self._report(message)

    async def _supervise(self, tunnel: _Tunnel) -> None:
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            up_since, detail = await self._run_ssh(tunnel)
            for forward in tunnel.spec.forwards:
                self._set(tunnel, forward.port, "down", detail)
            if up_since is not None and loop.time() - up_since >= STABLE_TUNNEL_S:
                attempt = 0
            # Full jitter: after a gateway restart every agent's tunnels come back spread out.
            delay = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))  # noqa: S311
            attempt = min(attempt + 1, 16)  # 2**attempt past ~1000 overflows a float
            # Said plainly for the first retries; a long gateway outage must not flood the log.
            level = logging.INFO if attempt <= 3 else logging.DEBUG
            log.log(level, "tunnel for lease %s: retrying in %.1f s", tunnel.lease_id, delay)
            await asyncio.sleep(delay)

    async def _run_ssh(self, tunnel: _Tunnel) -> tuple[float | None, str]:
        """One ssh run: report ports up as the gateway accepts them; return when ssh ends."""
        folder = self.lease_dir(tunnel.lease_id)
        argv = ssh_argv(tunnel.spec, folder / KEY_NAME, folder / "known_hosts", tunnel.host_ports)
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                # Its own group: a Ctrl-C meant for the agent does not cut renters' tunnels, and
                # stop() can end the whole group.
                start_new_session=True,
                # No agent settings in ssh's environment; C locale keeps its messages parseable.
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
            )
        except OSError as exc:
            return None, f"cannot run ssh: {exc}"
        up_since: float | None = None
        lines: deque[str] = deque(maxlen=40)
        try:
            (folder / "ssh.pid").write_text(f"{process.pid}\n")
            assert process.stderr is not None
            while True:
                try:
                    raw = await process.stderr.readline()
                except ValueError:  # a line past the stream limit: not one of ssh's own
                    continue
                if not raw:
                    break
                line = raw.decode(errors="replace").rstrip()
                if line.startswith("debug"):
                    log.debug("tunnel %s: %s", tunnel.lease_id, line)
                    reply = _FORWARD_REPLY.search(line)
                    port = tunnel.listen_to_port.get(int(reply.group(2))) if reply else None
                    if reply and port is not None and reply.group(1) == "success":
                        up_since = up_since or asyncio.get_running_loop().time()
                        self._set(tunnel, port, "up")
                    elif reply and port is not None:
                        failed = f"remote port forwarding failed for listen port {reply.group(2)}"
                        self._set(tunnel, port, "down", failed)
                elif line:
                    log.debug("tunnel %s: %s", tunnel.lease_id, line)
                    lines.append(line)
            returncode = await process.wait()
        finally:
            await _terminate(process)
            # The rest of stderr to its end: the pipe closes now, not when the garbage
            # collector finds it after the loop is gone (cancelled mid-read at shutdown).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(process.communicate(), TERM_GRACE_S)
        return up_since, exit_detail(list(lines), returncode)


async def _terminate(process: asyncio.subprocess.Process) -> None:
    """SIGTERM to ssh's process group, SIGKILL if it lingers."""
    if process.returncode is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            await asyncio.wait_for(process.wait(), TERM_GRACE_S)
            return
        except asyncio.TimeoutError:
            continue


def _kill_stale_ssh(folder: Path) -> None:
    """An agent killed hard (the unit's KillMode=process) leaves its ssh running; a second one
    would be refused the same listen port, so end the old one (if it is still ours)."""
    try:
        pid = int((folder / "ssh.pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return
    if str(folder / KEY_NAME).encode() in cmdline.split(b"\0"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)


async def _run_tool(*argv: str) -> str:
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except FileNotFoundError:
        raise TunnelUnavailable(MISSING_SSH.format(tool=argv[0])) from None
    try:
        out, err = await asyncio.wait_for(process.communicate(), TOOL_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise CommandFailed(f"{argv[0]} did not finish in {TOOL_TIMEOUT_S:.0f} s") from None
    finally:
        # Timed out, or cancelled (the agent stopping mid-keygen): the tool must not outlive
        # the call, nor its pipes stay open for the garbage collector to find after the loop
        # closed. Killed, drained and reaped here; on the normal path this returns at once.
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.communicate()
    if process.returncode != 0:
        raise CommandFailed(f"{argv[0]} failed: {err.decode(errors='replace').strip()}")
    return out.decode()
