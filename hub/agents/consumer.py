"""The agents' WebSocket. Thin: validate the frame against supplier_agent.protocol, await one
service, reply. Nothing an agent sends can crash the handler."""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import DatabaseError
from redis.exceptions import RedisError

from hub.agents import (
    heartbeat_batch,
    heartbeats,
    registration,
    registration_batch,
    token_batch,
    token_cache,
)
from hub.agents.db_threads import in_db_thread
from hub.agents.exec_relay import Delivery, ExecRoutes
from hub.leases import gpu_faults, terminals
from hub.leases import logs as lease_logs
from hub.leases import services as lease_services
from hub.lib import group_commit, local_channels, metrics, tokens
from hub.lib.compat_channels import dispatch_without_db_cleanup
from hub.lib.compat_daphne import client_left
from hub.rollouts import services as rollout_services
from hub.suppliers.services import record_rtt
from hub.tunnels import services as tunnel_services
from hub.volumes import services as volume_services
from supplier_agent import logjson
from supplier_agent.protocol import (
    AGENT_TO_HUB,
    CLOSE_UNSUPPORTED_PROTOCOL,
    Ack,
    ContainerExited,
    Error,
    ExecExit,
    ExecOutput,
    GpuHealthReport,
    Heartbeat,
    LeaseNotice,
    LogChunk,
    Message,
    Ping,
    Pong,
    ProtocolError,
    Register,
    TunnelState,
    UnsupportedVersion,
    UpgradeStatus,
    VolumeReport,
    Welcome,
    encode,
    parse_message,
)

log = logging.getLogger(__name__)


# A well-behaved agent sends a heartbeat every 15 s plus an ack per command.
MAX_FRAMES_PER_WINDOW = 300
FRAME_WINDOW_S = 10.0
CLOSE_TOO_MANY_FRAMES = 4429
CLOSE_SUPERSEDED = 4409
CLOSE_NO_REGISTER = 4408
# The round trip is rewritten only past this change (or a fifth of the last value written).
RTT_WRITE_MIN_CHANGE_MS = 5
# Live log chunks have their own budget instead (several followed leases at the agent's own
# cap of 64 KiB/s each); past it chunks are dropped, the socket stays.
LOG_BYTES_PER_WINDOW = 4 * 1024 * 1024
# Leases whose host this socket has checked; bounded so a lying agent cannot grow it forever.
MAX_LOG_LEASES_CACHED = 256
# Chunks for leases not yet checked cost a query each: at most this many lookups per window
# (an agent follows a handful of leases; 5,000 made-up lease ids were 5,000 queries).
MAX_LOG_LOOKUPS_PER_WINDOW = 16
# Log chunks past this many per window are dropped (the socket stays): a bound on the work
# however small the chunks.
MAX_LOG_FRAMES_PER_WINDOW = 2000

# Close codes: a refused token closes before accept (HTTP 403 at the handshake); revocation
# of a live connection closes with 4403.
CLOSE_TOKEN_REVOKED = 4403


def _bearer(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, credential = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and credential.strip():
                return credential.strip()
    # The original agents put the token in the path: /api/p2p/ws/<token>.
    return scope.get("url_route", {}).get("kwargs", {}).get("token")


class AgentConsumer(AsyncWebsocketConsumer):
    # One of these per agent: slots, not the instance dict, which CPython had to unshare
    # (sockets set their attributes in different orders: pinged, closed, refused) into a
    # ~1.5 KiB dict each; 10,000 sockets held 8 % more memory for it (docs/benchmarks.md).
    # Channels' own attributes (scope, channel_name, ...) still live in the dict.
    __slots__ = (
        "_closing",
        "_counted",
        "_exec",
        "_faults_seen",
        "_frames_in_window",
        "_heartbeats",
        "_log_bytes_in_window",
        "_log_frames_in_window",
        "_log_leases",
        "_log_lookups_in_window",
        "_ping_due",
        "_ping_nonce",
        "_ping_sent_at",
        "_receive",
        "_register_deadline",
        "_rtt_written",
        "_window_started",
        "host_id",
        "token_id",
    )
    token_id: int | None
    host_id: int | None
    # Set once this side closes: frames still buffered are dropped without work or logs.
    _closing: bool
    # Counted in cloudgpu_agents_connected (from the first registration to the disconnect;
    # not host_id, which a superseded socket clears before its disconnect runs).
    _counted: bool
    _heartbeats: heartbeats.Connection
    _window_started: float
    _frames_in_window: int
    _log_bytes_in_window: int
    _log_frames_in_window: int
    _log_lookups_in_window: int
    # Made on first use: most agents never send logs, open terminals or report a GPU fault.
    _log_leases: dict[str, bool] | None  # lease id -> on this socket's host
    _exec: ExecRoutes | None  # renters' terminals opened through this socket
    _faults_seen: frozenset[gpu_faults.Fault]  # GPU faults passed on already
    _register_deadline: asyncio.Task[None] | None
    _ping_due: float  # when the next round-trip ping goes out with a heartbeat
    _ping_nonce: str | None
    _ping_sent_at: float
    _rtt_written: int | None  # the round trip last written to the host's row

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.token_id = self.host_id = None
        self._closing = self._counted = False
        self._heartbeats = heartbeats.Connection()
        self._window_started = 0.0
        self._frames_in_window = self._log_bytes_in_window = 0
        self._log_frames_in_window = self._log_lookups_in_window = 0
        self._log_leases = self._exec = None
        self._faults_seen = frozenset()
        self._register_deadline = None
        self._ping_due = float("inf")
        self._ping_nonce = None
        self._ping_sent_at = 0.0
        self._rtt_written = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self._receive = receive  # only to look for an unread disconnect (the batches)
        await super().__call__(scope, receive, send)

    async def connect(self) -> None:
        plaintext = _bearer(self.scope)
        # A token this process accepted a moment ago costs no query: register re-checks it
        # (token_cache.py says why that is safe). In a storm, a supplier's hosts share one.
        token_id = token_cache.accepted.lookup(plaintext)
        if token_id is None and plaintext and tokens.well_formed(plaintext):
            # A made-up token costs no query; a real one joins the next batch (token_batch.py).
            try:
                token_id = await token_batch.check(plaintext, lambda: client_left(self._receive))
            except group_commit.ClientLeft:
                return  # Daphne already closed it; the queued disconnect ends this consumer
            if token_id is not None:
                token_cache.accepted.remember(plaintext, token_id)
        if token_id is None:
            await self.close()  # before accept: Daphne answers the handshake with 403
            return
        self.token_id = token_id
        self._window_started = time.monotonic()
        # No per-token group: revocation reaches registered sockets through their hosts'
        # channels, and `register` re-checks the token. A group_add (and group_discard) per
        # connection cost a pooled Redis connection per concurrent handshake in a storm.
        await self.accept()
        local_channels.register(self)  # renters' terminals in this process skip Redis
        # A socket that never registers holds resources without being a host: close it.
        self._register_deadline = asyncio.create_task(self._close_unless_registered())

    async def _close_unless_registered(self) -> None:
        await asyncio.sleep(settings.AGENT_REGISTER_TIMEOUT_S)
        if self.host_id is None:
            await self._close(CLOSE_NO_REGISTER)

    async def dispatch(self, message: dict[str, Any]) -> None:
        # Channels' own dispatch first hops to the sync thread to close stale DB connections,
        # for every frame of every socket: measured as the main cost of a heartbeat (see
        # docs/benchmarks.md). Every DB call here goes through database_sync_to_async, which
        # does that clean-up itself, so frames that need no database skip the hop.
        await dispatch_without_db_cleanup(self, message)

    async def disconnect(self, code: int) -> None:
        local_channels.unregister(self)
        if self._counted:
            self._counted = False
            metrics.AGENTS_CONNECTED.dec()
        if self._register_deadline is not None:
            self._register_deadline.cancel()
        exec_routes = self._exec
        if exec_routes is not None and len(exec_routes):
            for session_id, delivery in exec_routes.drop_all(
                "the host's agent disconnected from the hub; the session ended"
            ):
                await self._deliver(delivery)
                await in_db_thread(terminals.note_closed)(
                    session_id, reason="the host disconnected"
                )
        if self.host_id is not None:
            await in_db_thread(registration.detach_channel)(self.host_id, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self._closing:
            return
        try:
            message: Message | None = parse_message(
                text_data if text_data is not None else (bytes_data or b""), allowed=AGENT_TO_HUB
            )
            refusal = None
        except UnsupportedVersion as exc:
            # Another agent altogether (e.g. the seed's Go agent, whose frames carry no "v"):
            # one answer saying what this hub speaks, then a close code its logs can show.
            log.info("agent socket speaks another protocol (%s); closing", exc)
            await self._reply(
                Error(
                    reason=f"{exc}. This hub speaks the CloudGPU agent protocol v1 (JSON text "
                    'frames with "v": 1); install its agent with '
                    f"{settings.HUB_PUBLIC_URL}/install.sh"
                )
            )
            await self._close(CLOSE_UNSUPPORTED_PROTOCOL)
            return
        except ProtocolError as exc:
            message, refusal = None, exc
        if isinstance(message, LogChunk) and self.host_id is not None:
            # Output comes in bursts: it has a byte budget, not a share of the frame limit.
            await self._log_chunk(message)
            return
        if isinstance(message, (ExecOutput, ExecExit)) and self.host_id is not None:
            # Terminals too (a budget of their own in exec_relay.py): typing is many frames.
            await self._exec_frame(message)
            return
        if isinstance(message, Pong) and terminals.pong_session(message.nonce) is not None:
            # A terminal's ping answered (terminals.ping_event): back to that terminal only.
            await self._exec_frame(message)
            return
        if self._flooding():
            log.warning("agent on host %s sends too many frames; closing", self.host_id)
            await self._close(CLOSE_TOO_MANY_FRAMES)
            return
        if message is None:
            await self._reply(Error(reason=str(refusal)))
            return
        try:
            await self._handle(message)
        except registration.RegistrationRefused as exc:
            metrics.REGISTRATIONS.labels("refused").inc()
            if self.token_id is not None:
                # Revoked, perhaps: this process's next socket with it asks the database.
                token_cache.accepted.forget(self.token_id)
            await self._reply(Error(reason=str(exc), ref="register"))
            await self._close(None)
        except Exception as exc:
            if isinstance(exc, DatabaseError):
                metrics.STORE_ERRORS.labels("postgres").inc()
            elif isinstance(exc, RedisError):
                metrics.STORE_ERRORS.labels("redis").inc()
            # One bad message costs one error reply, never the connection or the process.
            log.exception("agent message %s failed", message.TYPE)
            await self._reply(Error(reason=f"the hub could not process {message.TYPE}"))

    def _flooding(self) -> bool:
        self._roll_window()
        self._frames_in_window += 1
        return self._frames_in_window > MAX_FRAMES_PER_WINDOW

    def _roll_window(self) -> None:
        now = time.monotonic()
        if now - self._window_started > FRAME_WINDOW_S:
            self._window_started = now
            self._frames_in_window = self._log_bytes_in_window = 0
            self._log_frames_in_window = self._log_lookups_in_window = 0

    async def _log_chunk(self, message: LogChunk) -> None:
        assert self.host_id is not None
        self._roll_window()
        self._log_bytes_in_window += len(message.data)
        self._log_frames_in_window += 1
        if (
            self._log_bytes_in_window > LOG_BYTES_PER_WINDOW
            or self._log_frames_in_window > MAX_LOG_FRAMES_PER_WINDOW
        ):
            return
        if self._log_leases is None:
            self._log_leases = {}
        allowed = self._log_leases.get(message.lease_id)
        if allowed is None:
            if self._log_lookups_in_window >= MAX_LOG_LOOKUPS_PER_WINDOW:
                return  # dropped unchecked: no query
            self._log_lookups_in_window += 1
            allowed = await in_db_thread(lease_logs.lease_on_host)(message.lease_id, self.host_id)
            if len(self._log_leases) >= MAX_LOG_LEASES_CACHED:
                self._log_leases.clear()
            self._log_leases[message.lease_id] = allowed
            if not allowed:
                log.warning(
                    "agent on host %s sent logs of lease %s, not its own",
                    self.host_id,
                    message.lease_id,
                )
                await self._reply(
                    Error(reason=f"lease {message.lease_id} is not on this host", ref="log_chunk")
                )
        if not allowed:
            return
        try:
            await lease_logs.publish(message)
        except RedisError as exc:
            log.warning("log chunk of lease %s not published: %s", message.lease_id, exc)

    async def _handle(self, message: Message) -> None:
        if isinstance(message, Register):
            await self._register(message)
            return
        if self.host_id is None:
            await self._reply(Error(reason="register first", ref=message.TYPE))
            return
        if isinstance(message, Heartbeat):
            await self._heartbeat(message)
        elif isinstance(message, Ack):
            # The ids go with the call into its thread (a copy of this context): the service's
            # log lines carry them under LOG_FORMAT=json.
            with logjson.bound(command_id=message.command_id):
                await in_db_thread(lease_services.record_ack)(self.host_id, message)
        elif isinstance(message, ContainerExited):
            with logjson.bound(lease_id=message.lease_id):
                await in_db_thread(lease_services.record_container_exit)(self.host_id, message)
        elif isinstance(message, LeaseNotice):
            with logjson.bound(lease_id=message.lease_id):
                await in_db_thread(lease_services.record_notice)(self.host_id, message)
        elif isinstance(message, TunnelState):
            await in_db_thread(tunnel_services.record_state)(self.host_id, message)
        elif isinstance(message, VolumeReport):
            await in_db_thread(volume_services.apply_report)(self.host_id, message)
        elif isinstance(message, GpuHealthReport):
            await self._gpu_health(message)
        elif isinstance(message, UpgradeStatus):
            await in_db_thread(rollout_services.record_status)(self.host_id, message)
        elif isinstance(message, Pong):
            await self._pong(message)
        elif isinstance(message, Error):
            log.info("agent on host %s says %s", self.host_id, message.TYPE)

    async def _register(self, message: Register) -> None:
        assert self.token_id is not None
        if message.probe:
            # `cloudgpu-agent smoke`: answer like a registration, change nothing (the real
            # agent may be connected right now on another socket).
            host_id = await in_db_thread(registration.probe_registration)(self.token_id, message)
            await self._reply(Welcome(host_id=host_id))
            return
        try:
            registered = await registration_batch.register(
                registration.Request(self.token_id, message, self.channel_name),
                lambda: client_left(self._receive),
            )
        except group_commit.ClientLeft:
            self._closing = True  # nobody to answer; the queued disconnect ends this consumer
            return
        self.host_id = registered.host_id
        logjson.bind(host_id=registered.host_id)  # this socket's later log lines carry it
        metrics.REGISTRATIONS.labels("ok").inc()
        if not self._counted:
            self._counted = True
            metrics.AGENTS_CONNECTED.inc()
        await self._reply(
            Welcome(
                host_id=str(registered.host_id),
                heartbeat_interval_s=settings.AGENT_HEARTBEAT_INTERVAL_S,
                desired_claims=registered.desired_claims,
                prepull_images=registered.prepull_images,
            )
        )
        for frame in registered.pending_frames:
            await self._send(frame)
        # Not at once: with a heartbeat, once the agent has settled in (its start-up work
        # would count as network time otherwise).
        self._ping_due = (
            time.monotonic()
            + settings.AGENT_RTT_FIRST_PING_S
            + random.uniform(0, settings.AGENT_RTT_FIRST_PING_SPREAD_S)  # noqa: S311 (spread)
        )

    async def _heartbeat(self, message: Heartbeat) -> None:
        assert self.host_id is not None
        await heartbeats.arrived(self._heartbeats, self.host_id, message, in_db_thread)
        if time.monotonic() >= self._ping_due:
            await self._ping()

    async def _ping(self) -> None:
        """The round trip renters see on offers: a ping the agent answers at once (every agent
        version does), timed here, so no agent's own figure is taken on trust."""
        self._ping_nonce = secrets.token_hex(8)
        self._ping_sent_at = time.monotonic()
        self._ping_due = self._ping_sent_at + settings.AGENT_RTT_PING_INTERVAL_S
        await self._reply(Ping(nonce=self._ping_nonce))

    async def _pong(self, message: Pong) -> None:
        if self.host_id is None or message.nonce != self._ping_nonce:
            return  # not ours, or answered already
        self._ping_nonce = None
        rtt_ms = round((time.monotonic() - self._ping_sent_at) * 1000)
        # A write only when the figure moved visibly: at 10,000 agents a ping every 5 minutes
        # would otherwise be ~33 updates a second for jitter nobody reads. Through Redis and
        # the telemetry flush, many hosts per statement (heartbeat_batch.record_rtt), not a
        # database call of this socket's own; straight to Postgres only while Redis is down.
        written = self._rtt_written
        if written is None or abs(rtt_ms - written) > max(RTT_WRITE_MIN_CHANGE_MS, written // 5):
            try:
                await heartbeat_batch.record_rtt(self.host_id, rtt_ms)
            except RedisError as exc:
                metrics.STORE_ERRORS.labels("redis").inc()
                log.warning("round trip not recorded in Redis (%s); writing to Postgres", exc)
                await in_db_thread(record_rtt)(self.host_id, rtt_ms)
            self._rtt_written = rtt_ms

    async def _gpu_health(self, message: GpuHealthReport) -> None:
        assert self.host_id is not None
        # Rules first, in the socket: a report without a failure (or with only failures this
        # socket already passed on) costs no query.
        faults = [f for f in gpu_faults.faults_in(message) if f not in self._faults_seen]
        if faults:
            await in_db_thread(gpu_faults.delist_failed_gpus)(self.host_id, faults)
            self._faults_seen = self._faults_seen.union(faults)

    async def _reply(self, message: Message) -> None:
        await self._send(encode(message))

    async def _send(self, frame: str) -> None:
        if self._closing:
            return
        try:
            await self.send(text_data=frame)
        except Exception as exc:
            # The peer went away under us (Daphne raises autobahn's Disconnected, "Attempt to
            # send on a closed protocol"). Nothing to answer to; raising here reached Daphne
            # and skipped disconnect(), leaving the host a dead channel.
            self._closing = True
            log.info("agent on host %s: socket closed before a send (%s)", self.host_id, exc)

    def _exec_routes(self) -> ExecRoutes:
        if self._exec is None:
            self._exec = ExecRoutes()
        return self._exec

    async def _exec_frame(self, message: ExecOutput | ExecExit | Pong) -> None:
        delivery = self._exec_routes().from_agent(message)
        if delivery is None:
            return
        await self._deliver(delivery)
        if isinstance(message, ExecExit):
            await in_db_thread(terminals.note_closed)(
                message.session_id, exit_code=message.exit_code, reason=message.error or ""
            )

    async def _deliver(self, delivery: Delivery) -> None:
        try:
            await local_channels.send(self.channel_layer, delivery.channel, delivery.event)
        except Exception as exc:  # the renter's socket is gone (ChannelFull), or Redis is
            log.info("terminal output for %s not delivered: %r", delivery.channel, exc)

    async def _close(self, code: int | None) -> None:
        if self._closing:
            return
        self._closing = True
        try:
            await self.close(code=code)  # None: Channels' plain close
        except Exception as exc:
            log.info("agent on host %s: socket already closed (%s)", self.host_id, exc)

    # --- channel layer events -----------------------------------------------------------

    async def agent_command(self, event: dict[str, Any]) -> None:
        await self._send(event["frame"])

    async def agent_exec(self, event: dict[str, Any]) -> None:
        routes = self._exec_routes()
        frame = routes.to_agent(event)
        if frame is None:
            refusal = routes.refused_open(event)
            if refusal is not None:
                await self._deliver(refusal)
            return
        await self._send(frame)

    async def agent_revoked(self, event: dict[str, Any]) -> None:
        if self.token_id is not None:
            token_cache.accepted.forget(self.token_id)  # new sockets with it: 403 at once
        await self._close(CLOSE_TOKEN_REVOKED)

    async def agent_marked_offline(self, event: dict[str, Any]) -> None:
        # The sweep gave up on this host while this socket stayed open: its next heartbeat
        # brings it back (heartbeats.py), seconds later rather than at the next flush.
        self._heartbeats.marked_offline = True

    async def agent_superseded(self, event: dict[str, Any]) -> None:
        # The same agent id registered on a newer connection; only one may speak for a host.
        self.host_id = None
        await self._close(CLOSE_SUPERSEDED)
