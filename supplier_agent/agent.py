"""The agent's connection to the hub: register, heartbeat, execute commands, reconnect.

One outbound WebSocket (the agent never listens). Commands are executed at most once in
effect: answers are journaled by ``command_id`` in the state folder, and every runtime step is
idempotent besides. Containers outlive the agent process and are re-adopted on start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from supplier_agent.config import AgentConfig
from supplier_agent.host_paths import redact_host_paths
from supplier_agent.hub_link import (
    TOKEN_CLOSE_CODES,
    WELCOME_TIMEOUT_S,
    TokenRejected,
    claim_states,
    classify_handshake_error,
    open_connection,
    register_message,
)
from supplier_agent.lease_locks import LeaseLocks
from supplier_agent.logjson import bind
from supplier_agent.logs import LogFollowers
from supplier_agent.protocol import (
    CLOSE_UNSUPPORTED_PROTOCOL,
    HUB_TO_AGENT,
    MAX_PIDS,
    Ack,
    Command,
    ContainerExited,
    DockerRun,
    Error,
    ExecClose,
    ExecInput,
    ExecOpen,
    ExecResize,
    GpuHealth,
    GpuHealthReport,
    Heartbeat,
    LeaseNotice,
    LogChunk,
    Logs,
    Message,
    Ping,
    Pong,
    ProtocolError,
    Register,
    Release,
    Reserve,
    Rollback,
    TunnelSpec,
    TunnelState,
    Upgrade,
    VolumeDelete,
    Welcome,
    encode,
    parse_message,
)
from supplier_agent.runtime import CommandFailed, Runtime
from supplier_agent.self_upgrade import SelfUpgrader
from supplier_agent.state import AgentState, Claim
from supplier_agent.terminals import Terminals
from supplier_agent.tunnels import (
    TunnelManager,
    require_tools,
    spec_to_dict,
    tunnel_tools_present,
)

log = logging.getLogger("cloudgpu.agent")


async def _nowhere(message: Message) -> None:
    """Frames of terminals with no connection: nobody to send them to."""


# How long docker_run waits for the lease's tunnel to be up before acking without it (with a
# warning per port): well inside the command's deadline, long enough for a gateway round trip.
TUNNEL_UP_WAIT_S = 15.0
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
# A connection that lived this long counts as healthy: the next failure starts backoff afresh.
STABLE_CONNECTION_S = 60.0
DEADMAN_CHECK_S = 5.0
# A lease is released by the dead-man switch only this long after its paid time, so a short
# hub outage around a top-up never ends paid work.
DEADMAN_GRACE_S = 300
# ack.error is at most 4096 characters in the protocol.
MAX_ERROR_CHARS = 3000


class TrialFailed(Exception):
    """``run --trial`` did not hold up for its window; the message says why, in one line."""


# How often `run --trial` asks the runtime for its GPUs while it waits out its window.
TRIAL_POLL_S = 5.0
RESTART_FLUSH_S = 10.0


class Agent:
    def __init__(self, config: AgentConfig, runtime: Runtime, state: AgentState) -> None:
        self.config = config
        self.runtime = runtime
        self.state = state
        self.heartbeat_interval_s = 15.0
        self.connected = asyncio.Event()
        self._outbox: asyncio.Queue[Message] = asyncio.Queue()
        # Exits the hub has not acted on yet (no release came): re-sent with each heartbeat,
        # so a report lost in a reconnect or a hub hiccup does not leave a lease billed forever.
        self._pending_exits: dict[str, ContainerExited] = {}
        self._lease_locks = LeaseLocks()
        self._tasks: set[asyncio.Task[None]] = set()
        self.tunnels = TunnelManager(state.dir, self._note_tunnel_state)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.logs = LogFollowers(runtime, self._send_from_thread, self._log_follow_failed)
        # The GPU health last reported on this connection (None: nothing yet).
        self._health_sent: tuple[GpuHealth, ...] | None = None
        # Read by the metrics endpoint (metrics.py): connections lost since the agent started.
        self.reconnects = 0
        # Replaced on every connection (_session); this one belongs to none.
        self._terminals = Terminals(runtime.open_exec, _nowhere)
        # A hub rollout's upgrade or rollback; without systemd it ends with this process
        # stopping and cli.cmd_run exec-ing ``reexec_argv``: the new version, same arguments.
        self.upgrader = SelfUpgrader(config, self._outbox.put_nowait, self._restart_into)
        self.reexec_argv: list[str] | None = None
        self._stop: asyncio.Event | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._stop = stop
        held = await self.runtime.adopt(dict(self.state.claims))
        for lease_id in list(self.state.claims):
            if lease_id not in held:
                log.info("claim for lease %s did not survive; dropping it", lease_id)
                self.state.drop_claim(lease_id)
        self.tunnels.forget_keys(keep=set(self.state.claims))
        await self._restart_tunnels()
        if tunnel_tools_present():
            self._spawn(self._refill_tunnel_key())  # the first rental's key, made ahead
        watcher_stop = threading.Event()
        loop = asyncio.get_running_loop()
        self._loop = loop

        def report_exit(lease_id: str, exit_code: int, log_tail: str, oom_killed: bool) -> None:
            message = ContainerExited(
                lease_id=lease_id, exit_code=exit_code, log_tail=log_tail, oom_killed=oom_killed
            )
            loop.call_soon_threadsafe(self._note_exit, message)

        def disk_event(lease_id: str, cause: str, sentence: str) -> None:
            if not cause:  # a notice for the renter; the rental goes on
                self._send_from_thread(LeaseNotice(lease_id=lease_id, text=sentence))
                return
            message = ContainerExited(
                lease_id=lease_id,
                exit_code=137,  # killed
                stop_cause=cause,
                stop_reason=sentence,
            )
            loop.call_soon_threadsafe(self._note_exit, message)

        watcher = loop.run_in_executor(None, self.runtime.watch_exits, report_exit, watcher_stop)
        disk_watcher = loop.run_in_executor(None, self.runtime.watch_disk, disk_event, watcher_stop)
        deadman = asyncio.create_task(self._deadman_loop(stop))
        housekeeping = asyncio.create_task(self._housekeeping_loop(stop))
        try:
            await self._connect_forever(stop)
        finally:
            watcher_stop.set()
            self.logs.stop_all()
            deadman.cancel()
            housekeeping.cancel()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(deadman, *self._tasks, return_exceptions=True)
            # The claims survive a restart, so the keys the hub registered stay on disk.
            await self.tunnels.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(watcher, timeout=10)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(disk_watcher, timeout=10)
            await self.runtime.close()

    async def _restart_tunnels(self) -> None:
        for claim in self.state.claims.values():
            if not claim.tunnel or not claim.ports:
                continue
            try:
                spec = TunnelSpec.parse(claim.tunnel, "claim.tunnel")
                await self.tunnels.start(claim.lease_id, spec, claim.ports)
            except (ProtocolError, CommandFailed) as exc:
                log.error("cannot reopen the tunnel of lease %s: %s", claim.lease_id, exc)
            except Exception:
                # One tunnel that cannot be reopened must not keep the agent from starting.
                log.exception("reopening the tunnel of lease %s failed", claim.lease_id)

    async def _connect_forever(self, stop: asyncio.Event) -> None:
        attempt = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self._session(stop)
            except TokenRejected as exc:
                log.error("%s; check the token with `cloudgpu-agent smoke`", exc)
            except ConnectionClosed as exc:
                if exc.rcvd is not None and exc.rcvd.code == CLOSE_UNSUPPORTED_PROTOCOL:
                    log.error(
                        "the hub does not speak this agent's protocol (close code %s): "
                        "upgrade the agent with `cloudgpu-agent upgrade`",
                        exc.rcvd.code,
                    )
                else:
                    log.warning("connection to the hub lost: %s", _describe(exc))
            except (OSError, InvalidHandshake, asyncio.TimeoutError) as exc:
                log.warning("connection to the hub lost: %s", _describe(exc))
            except ProtocolError as exc:
                log.warning("the hub sent something unexpected: %s", exc)
            except Exception:
                # Whatever went wrong, the agent reconnects; it never exits on its own.
                log.exception("unexpected error in the hub session")
            finally:
                self.connected.clear()
            if stop.is_set():
                return
            self.reconnects += 1
            if time.monotonic() - started > STABLE_CONNECTION_S:
                attempt = 0
            # Full jitter: thousands of agents reconnecting after a hub restart spread out.
            delay = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))  # noqa: S311
            attempt = min(attempt + 1, 16)  # 2**attempt past ~1000 overflows a float
            log.info("reconnecting in %.1f s", delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    async def _session(self, stop: asyncio.Event) -> None:
        try:
            connection = await open_connection(self.config)
        except InvalidStatus as exc:
            raise classify_handshake_error(exc) from None
        async with connection as ws:
            await ws.send(encode(await self._registration()))
            welcome = await asyncio.wait_for(self._await_welcome(ws), WELCOME_TIMEOUT_S)
            bind(host_id=welcome.host_id)  # every later log line of this connection says so
            log.info("connected to the hub as host %s", welcome.host_id)
            self.connected.set()
            self._health_sent = None  # a new hub process may not know: tell it again
            await self._apply_welcome(welcome)
            # Every (re)connect: the hub may have missed removals while we were apart.
            self._spawn(self._report_volumes(measure=True))
            # The hub may have restarted and lost what it knew of our tunnels: tell it again.
            for tunnel_state in self.tunnels.current_states():
                self._outbox.put_nowait(tunnel_state)
            # Renters' terminals live as long as this connection: nobody else sees their output.
            self._terminals = Terminals(self.runtime.open_exec, lambda m: ws.send(encode(m)))
            workers = [
                asyncio.create_task(self._receive_loop(ws)),
                asyncio.create_task(self._heartbeat_loop(ws)),
                asyncio.create_task(self._outbox_loop(ws)),
                asyncio.create_task(stop.wait()),
            ]
            try:
                done, _ = await asyncio.wait(workers, return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Nobody on the hub side watches any more; a new viewer asks again.
                self.logs.stop_all()
                self._terminals.close_all()
                for task in workers:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]

    async def _registration(self, *, probe: bool = False) -> Register:
        """The ``register`` frame, built the same way for a session and for ``run --trial``'s
        probe (which the hub answers without replacing the running agent's connection)."""
        gpus = await self.runtime.gpus()
        register = register_message(
            self.state.agent_id,
            claim_states(self.state),
            self.runtime.name,
            gpus,
            await self.runtime.host_facts(),
        )
        return dataclasses.replace(register, probe=True) if probe else register

    # --- run --trial ----------------------------------------------------------------------

    async def trial(self, window_s: float, stop: asyncio.Event) -> str:
        """``run --trial``: after ``run``'s own start-up, one probe registration with the hub,
        then ``window_s`` seconds up asking the runtime for its GPUs now and then; the host id
        the hub answered with. Never ``run()``: no adoption of containers, no claims, no
        watchers, and nothing written to the state folder (an agent may be running on it).
        Raises TrialFailed (or whatever crashed) if it does not hold up."""
        end = time.monotonic() + window_s
        try:
            host_id = await asyncio.wait_for(self._probe(), WELCOME_TIMEOUT_S)
            # The probe socket is closed at once: the hub closes a socket that has not
            # registered within 30 s (AGENT_REGISTER_TIMEOUT_S), and a probe never does.
            while (left := end - time.monotonic()) > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=min(TRIAL_POLL_S, left))
                if stop.is_set():
                    raise TrialFailed(f"stopped by a signal before its {window_s:g} s were up")
                await self.runtime.gpus()
                await self.runtime.gpu_health()
        finally:
            await self.runtime.close()
        return host_id

    async def _probe(self) -> str:
        try:
            connection = await open_connection(self.config)
        except InvalidStatus as exc:
            raise classify_handshake_error(exc) from None
        async with connection as ws:
            await ws.send(encode(await self._registration(probe=True)))
            try:
                welcome = await self._await_welcome(ws)
            except ConnectionClosed as exc:
                if exc.rcvd is not None and exc.rcvd.code in TOKEN_CLOSE_CODES:
                    raise TokenRejected(
                        f"the hub closed the connection: {exc.rcvd.reason}"
                    ) from None
                raise
        return welcome.host_id

    async def _await_welcome(self, ws: ClientConnection) -> Welcome:
        while True:
            message = await self._read(ws)
            if isinstance(message, Welcome):
                return message
            if isinstance(message, Error):
                raise ProtocolError(f"the hub refused registration: {message.reason}")

    async def _read(self, ws: ClientConnection) -> Message | None:
        frame = await ws.recv()
        try:
            return parse_message(frame, allowed=HUB_TO_AGENT)
        except ProtocolError as exc:
            log.warning("invalid frame from the hub: %s", exc)
            await ws.send(encode(Error(reason=str(exc))))
            return None

    async def _apply_welcome(self, welcome: Welcome) -> None:
        self.heartbeat_interval_s = float(welcome.heartbeat_interval_s)
        desired = set(welcome.desired_claims)
        for lease_id in [lease for lease in self.state.claims if lease not in desired]:
            log.info("the hub does not know lease %s; releasing its claim", lease_id)
            # In the background: a container stop can take its whole grace period (10 s, more
            # for several leases), and heartbeats must not wait for it or the host goes offline.
            self._spawn(self._release_locally(lease_id))
        if welcome.prepull_images:
            self._spawn(self.runtime.prepull(welcome.prepull_images))

    # --- loops ----------------------------------------------------------------------------

    async def _receive_loop(self, ws: ClientConnection) -> None:
        while True:
            message = await self._read(ws)
            if message is None:
                continue
            if isinstance(message, Ping):
                await ws.send(encode(Pong(nonce=message.nonce)))
            elif isinstance(message, Command):
                self._spawn(self._handle_command(ws, message))
            elif isinstance(message, Logs):
                await self._follow_logs(ws, message)
            elif isinstance(message, VolumeDelete):
                self._spawn(self._delete_volume(message.name))
            elif isinstance(message, (ExecOpen, ExecInput, ExecResize, ExecClose)):
                # In the background, in order per session (terminals.py): a process that reads
                # no input must not hold up the hub's other messages.
                self._spawn(self._terminals.handle(message))
            elif isinstance(message, Upgrade):
                self._spawn(self.upgrader.upgrade(message))
            elif isinstance(message, Rollback):
                self._spawn(self.upgrader.rollback(message))
            elif isinstance(message, Welcome):
                await self._apply_welcome(message)
            elif isinstance(message, Error):
                log.warning("the hub reports an error: %s", message.reason)

    async def _heartbeat_loop(self, ws: ClientConnection) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            gpus = await self.runtime.gpus()
            claims = claim_states(self.state)
            if any(gpu.processes for gpu in gpus) and claims:
                # Only worth a `docker top` when NVML shows compute processes at all.
                pids = await self.runtime.container_pids([c.lease_id for c in claims])
                claims = tuple(
                    dataclasses.replace(c, pids=tuple(pids.get(c.lease_id, ())[:MAX_PIDS]))
                    for c in claims
                )
            await ws.send(encode(Heartbeat(gpus=tuple(gpus), claims=claims)))
            await self._report_gpu_health(ws)
            for lease_id, exited in list(self._pending_exits.items()):
                if lease_id in self.state.claims:
                    await ws.send(encode(exited))
                else:
                    del self._pending_exits[lease_id]

    async def _report_gpu_health(self, ws: ClientConnection) -> None:
        """A ``gpu_health`` report when the GPUs' health changed since the last one on this
        connection; nothing while every GPU has been healthy throughout."""
        health = tuple(await self.runtime.gpu_health())
        previous = self._health_sent
        if health == previous or (previous is None and all(g.healthy for g in health)):
            return
        await ws.send(encode(GpuHealthReport(gpus=health)))
        self._health_sent = health

    async def _outbox_loop(self, ws: ClientConnection) -> None:
        while True:
            message = await self._outbox.get()
            try:
                await ws.send(encode(message))
            except ConnectionClosed:
                # Keep it for the next connection: a container exit must reach the hub.
                # Live output is only worth something live.
                if not isinstance(message, LogChunk):
                    self._outbox.put_nowait(message)
                raise
            finally:
                self._outbox.task_done()  # join() (_stop_once_sent) waits for what is sent

    async def _deadman_loop(self, stop: asyncio.Event) -> None:
        """While the hub is away, end leases whose paid time is over; never a paid one."""
        while not stop.is_set():
            await asyncio.sleep(DEADMAN_CHECK_S)
            if self.connected.is_set():
                continue
            now = datetime.now(timezone.utc)
            for claim in list(self.state.claims.values()):
                paid_until = _parse_time(claim.paid_until)
                if paid_until is not None and paid_until + timedelta(seconds=DEADMAN_GRACE_S) < now:
                    log.warning(
                        "hub unreachable and lease %s paid only until %s: releasing it",
                        claim.lease_id,
                        claim.paid_until,
                    )
                    await self._release_locally(claim.lease_id)

    async def _housekeeping_loop(self, stop: asyncio.Event) -> None:
        """Idle renters' volumes removed (volumes.py), soon after start, then hourly, and the
        hub told what is left and what went."""
        delay = self.config.housekeeping_first_s
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)
            if stop.is_set():
                return
            try:
                await self.runtime.housekeeping()
            except Exception:
                log.exception("housekeeping failed")
            # Disconnected, it would only queue up: the next welcome brings a fresh report.
            if self.connected.is_set():
                await self._report_volumes(measure=True)
            delay = self.config.housekeeping_every_s

    async def _report_volumes(self, *, measure: bool) -> None:
        try:
            reports = await self.runtime.volume_reports(measure=measure)
        except Exception:
            log.exception("reporting volumes failed")
            return
        for report in reports:
            self._outbox.put_nowait(report)

    async def _delete_volume(self, name: str) -> None:
        # Only once it is gone: the report's removal is what the hub waits for. One still
        # mounted goes when its lease is released (or at the next sweep), and is reported then.
        if await self.runtime.delete_volume(name):
            await self._report_volumes(measure=False)

    async def _delete_freed_volumes(self) -> None:
        if await self.runtime.delete_pending_volumes():
            await self._report_volumes(measure=False)

    def _note_exit(self, message: ContainerExited) -> None:
        self._pending_exits[message.lease_id] = message
        self._outbox.put_nowait(message)

    async def _refill_tunnel_key(self) -> None:
        try:
            await self.tunnels.refill_spare()
        except (OSError, CommandFailed) as exc:
            log.info("could not make a spare tunnel key: %s", exc)

    def _note_tunnel_state(self, message: TunnelState) -> None:
        self._outbox.put_nowait(message)

    def _restart_into(self, argv: list[str]) -> None:
        self.reexec_argv = argv
        self._spawn(self._stop_once_sent())

    async def _stop_once_sent(self) -> None:
        # The upgrade's last status goes out first (the hub shows it); 10 s at most.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._outbox.join(), RESTART_FLUSH_S)
        log.info("restarting into %s", self.reexec_argv[0] if self.reexec_argv else "?")
        if self._stop is not None:
            self._stop.set()

    def _send_from_thread(self, message: Message) -> None:
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                self._loop.call_soon_threadsafe(self._outbox.put_nowait, message)

    def _log_follow_failed(self, lease_id: str, reason: str) -> None:
        self._send_from_thread(Error(reason=f"lease {lease_id}: {reason}"[:4096], ref="logs"))

    async def _follow_logs(self, ws: ClientConnection, message: Logs) -> None:
        if not message.follow:
            self.logs.stop(message.lease_id)
            return
        claim = self.state.claims.get(message.lease_id)
        if claim is None or claim.container_id is None:
            reason = f"lease {message.lease_id} has no container on this host"
            with contextlib.suppress(ConnectionClosed):
                await ws.send(encode(Error(reason=reason, ref="logs")))
            return
        self.logs.follow(message.lease_id, message.tail)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- commands -------------------------------------------------------------------------

    async def _handle_command(self, ws: ClientConnection, command: Command) -> None:
        # This task's own context: its log lines name the lease and command (LOG_FORMAT=json).
        bind(lease_id=command.lease_id, command_id=command.command_id)
        async with self._lease_locks.hold(command.lease_id):
            stored = self.state.answer_for(command.command_id)
            if stored is None:
                ack = await self.execute(command)
                self.state.remember_answer(command.command_id, ack.to_dict())
            else:
                log.info("command %s seen before; repeating its answer", command.command_id)
                ack = Ack.from_dict(stored)
        with contextlib.suppress(ConnectionClosed):
            await ws.send(encode(ack))

    async def execute(self, command: Command) -> Ack:
        try:
            if isinstance(command, Reserve):
                result = await self._reserve(command)
            elif isinstance(command, DockerRun):
                result = await self._docker_run(command)
            elif isinstance(command, Release):
                result = await self._release(command)
            else:  # pragma: no cover - parse_message only yields the above
                raise CommandFailed(f"unsupported command {command.TYPE}")
        except CommandFailed as exc:
            # The whole text here; the hub, and so the renter, gets it without host paths.
            log.warning("%s for lease %s failed: %s", command.TYPE, command.lease_id, exc)
            return self._refusal(command, str(exc))
        except Exception as exc:
            # A bug or an engine failure must cost one command, not the connection.
            log.exception("%s for lease %s crashed", command.TYPE, command.lease_id)
            return self._refusal(command, f"agent error: {exc}")
        return Ack(command_id=command.command_id, ok=True, result=result)

    def _refusal(self, command: Command, error: str) -> Ack:
        """The ack of a failed command. Its error becomes the lease's failure reason, which the
        renter reads: Docker's and runc's host paths are left out (before ``_fit``, so a cut
        cannot leave half a path), the paths the renter chose stay."""
        chosen: list[str] = []
        if isinstance(command, DockerRun):
            chosen = [volume.path for volume in command.volumes]
            if command.cache_volume is not None:
                chosen.append(command.cache_volume.path)
        folders = [str(self.state.dir.absolute()), *self.runtime.host_folders]
        text = redact_host_paths(error, host_folders=folders, keep=chosen)
        return Ack(command_id=command.command_id, ok=False, error=_fit(text))

    def _check_epoch(self, gpu_indices: list[int] | tuple[int, ...], epoch: int) -> None:
        newer = self.state.stale_epoch(gpu_indices, epoch)
        if newer is not None:
            raise CommandFailed(f"stale epoch {epoch}: GPU already granted under epoch {newer}")

    async def _reserve(self, command: Reserve) -> dict[str, Any]:
        selector = command.selector
        if selector and isinstance(selector[0], int):
            self._check_epoch(selector, command.epoch)  # type: ignore[arg-type]
        outcome = await self.runtime.reserve(command.lease_id, selector)
        try:
            self._check_epoch(outcome.gpu_indices, command.epoch)
        except CommandFailed:
            await self.runtime.release(command.lease_id, None)
            raise
        existing = self.state.claims.get(command.lease_id)
        claim = Claim(
            lease_id=command.lease_id,
            gpu_indices=list(outcome.gpu_indices),
            epoch=command.epoch,
            container_id=existing.container_id if existing else None,
            ports=dict(existing.ports) if existing else {},
            paid_until=existing.paid_until if existing else None,
            tunnel=existing.tunnel if existing else None,
        )
        try:
            self.state.note_epoch(outcome.gpu_indices, command.epoch)
            self.state.save_claim(claim)
        except BaseException:
            # Unrecorded, the claim would hold the GPU until a restart (a full disk, say).
            await self.runtime.release(command.lease_id, None)
            raise
        result: dict[str, Any] = {
            "gpu_indices": list(outcome.gpu_indices),
            "warnings": list(outcome.warnings),
        }
        if tunnel_tools_present():
            # The lease's tunnel key now, so the hub knows it before docker_run: the gateway then
            # takes the tunnel's first attempt, and docker_run can wait for it to be up.
            with contextlib.suppress(OSError, CommandFailed):
                result["tunnel_public_key"] = await self.tunnels.key_for_new_lease(command.lease_id)
            self._spawn(self._refill_tunnel_key())
        return result

    async def _docker_run(self, command: DockerRun) -> dict[str, Any]:
        claim = self.state.claims.get(command.lease_id)
        if claim is None:
            raise CommandFailed(f"lease {command.lease_id} holds no GPU here; reserve comes first")
        self._check_epoch(claim.gpu_indices, command.epoch)
        if command.tunnel is not None:
            require_tools()  # before the container: without ssh nobody could reach it
        claim.paid_until = command.paid_until
        if command.warmup:
            # The warm-up runs before the ack: its output goes out as the lease's log_chunk
            # frames while it runs, so the renter's page shows it live (same byte budget).
            with self.logs.streaming(command.lease_id) as output:
                outcome = await self.runtime.start(command, claim, output=output)
        else:
            outcome = await self.runtime.start(command, claim)
        claim.container_id = outcome.container_id
        claim.ports = dict(outcome.ports)
        if command.tunnel is None and claim.tunnel is not None:  # an earlier run had one
            await self.tunnels.stop(command.lease_id)
            claim.tunnel = None
        self.state.save_claim(claim)
        result = {"container_id": outcome.container_id, "ports": outcome.ports, **outcome.extra}
        if command.tunnel is None:
            return result
        result["tunnel_public_key"] = await self.tunnels.ensure_key(command.lease_id)
        claim.tunnel = spec_to_dict(command.tunnel)
        self.state.save_claim(claim)
        # The hub has the key from the reserve's ack (an older hub only from this ack: then the
        # first ssh attempt is refused and the supervisor's quick retry gets in).
        await self.tunnels.start(command.lease_id, command.tunnel, claim.ports)
        # Running means reachable (seed 002): ack once the forwards are up, or say which are not.
        down = await self.tunnels.wait_up(command.lease_id, TUNNEL_UP_WAIT_S)
        # In the ack itself, so the hub marks the URLs up with the lease running: the
        # tunnel_state frames, on the outbox, may come after it.
        result["tunnel_states"] = {
            str(forward.port): "down" if forward.port in down else "up"
            for forward in command.tunnel.forwards
        }
        if down:
            result["warnings"] = [
                *result.get("warnings", []),
                *(
                    f"port {port}: the tunnel is not up yet ({why}); its URL works once it is"
                    for port, why in sorted(down.items())
                ),
            ]
        return result

    async def _release(self, command: Release) -> dict[str, Any]:
        claim = self.state.claims.get(command.lease_id)
        if claim is not None:
            self._check_epoch(claim.gpu_indices, command.epoch)
        self.logs.stop(command.lease_id)
        await self.tunnels.stop(command.lease_id)
        warnings = await self.runtime.release(command.lease_id, claim)
        self.state.drop_claim(command.lease_id)
        self._pending_exits.pop(command.lease_id, None)
        self._spawn(self._delete_freed_volumes())
        return {"warnings": warnings}

    async def _release_locally(self, lease_id: str) -> None:
        async with self._lease_locks.hold(lease_id):
            claim = self.state.claims.get(lease_id)
            self.logs.stop(lease_id)
            await self.tunnels.stop(lease_id)
            try:
                await self.runtime.release(lease_id, claim)
            except Exception:
                log.exception("releasing lease %s failed; will retry on next start", lease_id)
                return
            self.state.drop_claim(lease_id)
        await self._delete_freed_volumes()


def _fit(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Errors end with the useful part (a log tail): keep the start and the end."""
    if len(text) <= limit:
        return text
    half = (limit - 5) // 2
    return f"{text[:half]} [..] {text[-half:]}"


def _parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
