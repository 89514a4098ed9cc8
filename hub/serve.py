"""The hub's web process: ``python -m hub.serve [daphne arguments...]``.

Exactly Daphne's own command line, with one difference: nothing it logs can show an agent
token. Why this exists: the original agents authenticate with the token in the URL
(``/api/p2p/ws/<token>``, see docs/architecture.md), and Daphne writes every request path to
its access log and Django/Twisted write paths into error records; a token in a log file is a leaked
credential. So the access log stream and every root-logger handler pass through
``hub.lib.redact.redact`` on their way out.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import time
import tracemalloc
from collections.abc import Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, cast

from daphne import server as daphne_server
from daphne.access import AccessLogGenerator
from daphne.cli import CommandLineInterface
from daphne.server import Server
from daphne.ws_protocol import WebSocketFactory, WebSocketProtocol
from django.conf import settings
from twisted.internet import reactor
from twisted.internet.task import LoopingCall

from hub.lib import channel_send
from hub.lib.compat_daphne import (
    http_channel_of,
    make_autobahn_debug_lines_lazy,
    replace_http_factory,
    replace_ws_factory,
    serving_loop,
)
from hub.lib.gc_schedule import FullCollections
from hub.lib.metrics_dir import sweep
from hub.lib.redact import redact


class RedactingStream:
    """A write-only text stream that redacts each write (Daphne writes one line per call);
    with LOG_FORMAT=json each line becomes a JSON object like every other log line."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._json = os.environ.get("LOG_FORMAT", "").strip().lower() == "json"

    def write(self, text: str) -> int:
        if self._json and text.strip():
            entry = {
                "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "level": "INFO",
                "logger": "daphne.access",
                "msg": redact(text.rstrip("\n")),
            }
            return self._stream.write(json.dumps(entry, ensure_ascii=False) + "\n")
        return self._stream.write(redact(text))

    def flush(self) -> None:
        self._stream.flush()


class RedactingFilter(logging.Filter):
    """Redacts a record's rendered message (and traceback) before any handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: the handler reports it as usual
            return True
        redacted = redact(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def install_log_filter() -> None:
    """Put one RedactingFilter on every handler of every logger configured so far.

    On handlers, not loggers: a logger's own filters skip records propagated from its
    children. Not only the root's: Django's default LOGGING gives the ``django`` logger a
    console handler of its own under DEBUG.
    """
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):  # placeholders have none
            if not any(isinstance(existing, RedactingFilter) for existing in handler.filters):
                handler.addFilter(RedactingFilter())


# Daphne's application_checker walks every connection once a second to reap finished
# application instances. With 10,000 agent sockets that walk was 16 % of the web process's CPU
# and a stall of the event loop every second (docs/benchmarks.md); each tick now walks one
# slice, so every connection is still checked every CHECK_SLICES seconds. What the override
# relies on in Daphne: hub.lib.compat_daphne.
CHECK_SLICES = 10


# The listening socket's accept queue. Twisted's default is 50: when a web process restarts,
# thousands of agents connect within a second or two, the queue overflowed, and the kernel
# dropped their SYNs, which clients resend only after 1, 3, 7 s, past the agent's 10 s budget
# to open a socket (docs/benchmarks.md, issue 18). The kernel caps it at net.core.somaxconn.
LISTEN_BACKLOG = 4096


def with_backlog(endpoints: list[str]) -> list[str]:
    """Daphne's endpoint descriptions (Twisted's strings), TCP ones with LISTEN_BACKLOG unless
    they name a backlog themselves."""
    return [
        f"{e}:backlog={LISTEN_BACKLOG}"
        if e.startswith(("tcp:", "tcp6:")) and "backlog=" not in e
        else e
        for e in endpoints
    ]


class RedactingServer(Server):
    def __init__(self, *args: Any, action_logger: Any = None, **kwargs: Any) -> None:
        # Daphne's CLI builds the access logger around stdout or the --access-log file.
        if isinstance(action_logger, AccessLogGenerator):
            action_logger.stream = RedactingStream(action_logger.stream)
        if kwargs.get("endpoints"):
            kwargs["endpoints"] = with_backlog(list(kwargs["endpoints"]))
        super().__init__(*args, action_logger=action_logger, **kwargs)
        self._check_tick = 0

    def application_checker(self) -> None:
        """Daphne's own check (and its rescheduling), over one slice of the connections."""
        everything = self.connections
        self._check_tick = (self._check_tick + 1) % CHECK_SLICES
        # A fixed slot per connection (its hash), so reaping does not shift the others' turn.
        chosen = [p for p in everything if hash(p) % CHECK_SLICES == self._check_tick]
        self.connections = {protocol: everything[protocol] for protocol in chosen}
        try:
            super().application_checker()
        finally:
            # The check deletes what it reaped from the dict it walked; the details dicts it
            # edited are the same objects as in the full one.
            for protocol in chosen:
                if protocol not in self.connections:
                    everything.pop(protocol, None)
            self.connections = everything


# A client has this long from connecting to the end of its first request's headers. Twisted's
# own timeout is an idle one that every byte resets: a client dripping a header byte every few
# seconds held a connection (and a Daphne slot) forever.
HEADER_DEADLINE_S = 10.0


class HeaderDeadlineFactory(daphne_server.HTTPFactory):
    def buildProtocol(self, addr: Any) -> Any:
        protocol = super().buildProtocol(addr)
        if full_collections is not None:
            full_collections.note_connection()  # a storm defers full collections
        # Twisted wraps the HTTPChannel (which parses the headers) in a protocol that proxies
        # only IProtocol: the hooks go on the channel itself.
        channel = http_channel_of(protocol)
        made, headers_done = channel.connectionMade, channel.allHeadersReceived
        state: dict[str, Any] = {"deadline": None}

        def connection_made() -> None:
            made()
            state["deadline"] = reactor.callLater(HEADER_DEADLINE_S, too_slow)

        def all_headers_received() -> None:
            deadline = state["deadline"]
            if deadline is not None and deadline.active():
                deadline.cancel()
            # Back to the class's methods: these closures would otherwise live as long as the
            # connection, ~0.8 KiB of every agent's socket for hours (docs/benchmarks.md).
            del channel.connectionMade, channel.allHeadersReceived
            state.clear()
            headers_done()

        def too_slow() -> None:
            log.info(
                "closing a connection whose request headers took over %.0f s", HEADER_DEADLINE_S
            )
            channel.transport.abortConnection()

        channel.connectionMade = connection_made
        channel.allHeadersReceived = all_headers_received
        return protocol


# Daphne's Server.run() builds its factory by a module-level name (hub.lib.compat_daphne).
replace_http_factory(HeaderDeadlineFactory)
# autobahn pretty-printed every connection's configuration for a debug line never shown.
make_autobahn_debug_lines_lazy()


# Backpressure for WebSockets: Daphne queues every incoming message for the consumer without a
# bound. A sender faster than its consumer (an agent's log_chunk frames on a loaded hub) grew
# the web process by what waited: issue 23's soak profiled 22.6 MiB of queued frame texts in
# 10 minutes. Past WS_QUEUE_PAUSE_AT waiting messages the socket is not read until the queue
# is down to WS_QUEUE_RESUME_AT; the sender then waits in TCP (the agent's own budgets bound
# what it keeps). Nothing is dropped.
WS_QUEUE_PAUSE_AT = 100
WS_QUEUE_RESUME_AT = 25
WS_RESUME_POLL_S = 0.02


class BoundedWebSocketProtocol(WebSocketProtocol):
    reading_paused = False

    def onMessage(self, payload: bytes, isBinary: bool) -> None:
        super().onMessage(payload, isBinary)
        queue = getattr(self, "application_queue", None)
        if queue is not None and not self.reading_paused and queue.qsize() >= WS_QUEUE_PAUSE_AT:
            self.reading_paused = True
            self.transport.pauseProducing()
            reactor.callLater(WS_RESUME_POLL_S, self.resume_when_drained)

    def resume_when_drained(self) -> None:
        if self.transport is None or not self.reading_paused:
            return
        if self.application_queue.qsize() > WS_QUEUE_RESUME_AT:
            reactor.callLater(WS_RESUME_POLL_S, self.resume_when_drained)
            return
        self.reading_paused = False
        self.transport.resumeProducing()


class BoundedWebSocketFactory(WebSocketFactory):
    protocol = BoundedWebSocketProtocol


replace_ws_factory(BoundedWebSocketFactory)


class RedactingCommandLineInterface(CommandLineInterface):
    server_class = RedactingServer

    def load_asgi_app(self, asgi_app_path: str) -> Any:
        install_log_filter()  # the handler Daphne's logging.basicConfig just added
        application = super().load_asgi_app(asgi_app_path)
        # Importing the app ran django.setup(), whose LOGGING replaced the root handlers.
        install_log_filter()
        tune_garbage_collection()
        schedule_full_collections()
        install_snapshot_signal()
        # Sync code's channel sends and Redis commands run on Daphne's loop, through the
        # channel layer's pool there: one pool (two connections) for the whole process.
        channel_send.use_loop(serving_loop())
        # Imported here: models load only after the app's django.setup().
        from hub.agents import storm

        # The offline sweep gives this process's returning agents one full deadline. Once the
        # loop runs (a sync call waits for it) and off it (the call blocks).
        reactor.callWhenRunning(reactor.callInThread, storm.note_web_started)
        return ResponseSizes(application)


# Garbage collection. With 10,000 agent sockets the web process holds a few million objects,
# and a full collection walks all of them: measured as 1.5-2 s pauses of the event loop, which
# set the heartbeat p99 at about 3 s (docs/benchmarks.md). Almost everything here is freed by
# reference counting; the collector is for cycles. So: freeze what exists after start-up (the
# code, Django's caches: never garbage), keep the young generations small (a pause is as long
# as its generation is big: 50,000 young objects took 250 ms here), leave full collections to
# the bounded schedule below (CPython's own, once 100 times rarer than its default, still came
# at any moment: in a reconnect storm a 6 s one failed every handshake in flight; the third
# threshold here means never), and log any pause long enough to matter.
GC_THRESHOLDS = (700, 10, 2**31 - 1)
GC_SLOW_PAUSE_S = 0.2

log = logging.getLogger("hub.serve")
_gc_started = 0.0


def _time_collections(phase: str, info: dict[str, int]) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
        return
    paused = time.perf_counter() - _gc_started
    if paused >= GC_SLOW_PAUSE_S:
        log.warning(
            "garbage collection (generation %s) paused the web process for %.0f ms",
            info.get("generation"),
            paused * 1000,
        )


def tune_garbage_collection() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    if _time_collections not in gc.callbacks:
        gc.callbacks.append(_time_collections)


# ... but full collections still come on a bounded schedule (hub/lib/gc_schedule.py): every
# GC_FULL_INTERVAL_S at most, sooner after GC_LARGE_RESPONSES_MIB of responses of 1 MiB or
# more. The schedule is looked at every GC_TICK_S from the reactor, between events, so a
# collection never interrupts a request half-way; each one's pause is logged.
GC_TICK_S = 5.0
full_collections: FullCollections | None = None


def schedule_full_collections() -> LoopingCall:
    global full_collections
    schedule = FullCollections(
        interval_s=settings.GC_FULL_INTERVAL_S,
        large_bytes=settings.GC_LARGE_RESPONSES_MIB * 1024 * 1024,
    )
    if full_collections is not None and full_collections.on_gc in gc.callbacks:
        gc.callbacks.remove(full_collections.on_gc)
    full_collections = schedule
    gc.callbacks.append(schedule.on_gc)
    call = LoopingCall(collect_if_due, schedule)
    call.clock = reactor
    call.start(GC_TICK_S, now=False)
    return call


def collect_if_due(schedule: FullCollections) -> None:
    done = schedule.tick()
    if done is not None:
        log.info(
            "full garbage collection (%s): %d unreachable objects, paused %.0f ms%s",
            done.reason,
            done.unreachable,
            done.paused_s * 1000,
            f", {done.deferred_s:.0f} s late for a storm of connections" if done.deferred_s else "",
        )


class ResponseSizes:
    """The ASGI application, counting the bytes of each HTTP response for the schedule."""

    # A plain __call__ returning the application's coroutine: asgiref would take it for an
    # ASGI 2 application without this.
    _asgi_single_callable = True

    def __init__(self, application: Any) -> None:
        self.application = application

    def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Awaitable[None]:
        schedule = full_collections
        if scope.get("type") != "http" or schedule is None:
            # Not awaited in a frame of ours: a WebSocket lives for hours, and so would it.
            return cast(Awaitable[None], self.application(scope, receive, send))
        return self._counted(schedule, scope, receive, send)

    async def _counted(
        self, schedule: FullCollections, scope: dict[str, Any], receive: Any, send: Any
    ) -> None:
        sent = 0

        async def counting_send(message: dict[str, Any]) -> None:
            nonlocal sent
            if message.get("type") == "http.response.body":
                sent += len(message.get("body", b""))
                if not message.get("more_body", False):
                    schedule.note_response(sent)
            await send(message)

        await self.application(scope, receive, counting_send)


# Profiling (docs/benchmarks.md, issue 23's soak): with HUB_TRACEMALLOC_DIR set, the web
# process traces its allocations once the application is loaded (12 frames each) and SIGUSR2
# writes a tracemalloc snapshot there. Nothing otherwise: tracing slows everything down.
TRACEMALLOC_FRAMES = 12


def install_snapshot_signal() -> None:
    folder = os.environ.get("HUB_TRACEMALLOC_DIR", "")
    if not folder:
        return
    if not tracemalloc.is_tracing():
        tracemalloc.start(TRACEMALLOC_FRAMES)

    def snapshot(signum: int, frame: Any) -> None:
        path = Path(folder) / f"web-{os.getpid()}-{time.time():.0f}.tracemalloc"
        tracemalloc.take_snapshot().dump(str(path))
        log.info("tracemalloc snapshot written to %s", path)

    signal.signal(signal.SIGUSR2, snapshot)


def ensure_metrics_dir() -> None:
    """The multiprocess metrics folder (PROMETHEUS_MULTIPROC_DIR), if one is set, must exist
    before the first metric is made. Processes that used it before this one (a container's
    previous run) are folded into its archive now rather than at the first scrape."""
    folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if folder:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        sweep(folder)


def main(argv: list[str] | None = None) -> None:
    ensure_metrics_dir()
    RedactingCommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
