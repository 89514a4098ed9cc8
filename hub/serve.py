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
import logging
import sys
import time
from typing import Any, TextIO

from daphne import server as daphne_server
from daphne.access import AccessLogGenerator
from daphne.cli import CommandLineInterface
from daphne.server import Server
from twisted.internet import reactor

from hub.lib.compat_daphne import (
    http_channel_of,
    make_autobahn_debug_lines_lazy,
    replace_http_factory,
)
from hub.lib.redact import redact


class RedactingStream:
    """A write-only text stream that redacts each write (Daphne writes one line per call)."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
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


class RedactingCommandLineInterface(CommandLineInterface):
    server_class = RedactingServer

    def load_asgi_app(self, asgi_app_path: str) -> Any:
        install_log_filter()  # the handler Daphne's logging.basicConfig just added
        application = super().load_asgi_app(asgi_app_path)
        # Importing the app ran django.setup(), whose LOGGING replaced the root handlers.
        install_log_filter()
        tune_garbage_collection()
        # Imported here: models load only after the app's django.setup().
        from hub.agents import storm

        # The offline sweep gives this process's returning agents one full deadline.
        storm.note_web_started()
        return application


# Garbage collection. With 10,000 agent sockets the web process holds a few million objects,
# and a full collection walks all of them: measured as 1.5-2 s pauses of the event loop, which
# set the heartbeat p99 at about 3 s (docs/benchmarks.md). Almost everything here is freed by
# reference counting; the collector is for cycles. So: freeze what exists after start-up (the
# code, Django's caches: never garbage), keep the young generations small (a pause is as long
# as its generation is big: 50,000 young objects took 250 ms here), make full collections about
# 100 times rarer than CPython's default, and log any pause long enough to matter.
GC_THRESHOLDS = (700, 10, 1000)
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


def main(argv: list[str] | None = None) -> None:
    RedactingCommandLineInterface().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
