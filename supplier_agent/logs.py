"""Live container logs: one follower per lease, started (or renewed) by the hub's ``logs``.

A follower is a thread that reads the runtime's blocking log stream and a second one that
flushes what was read, so output that trickles in still leaves within ~200 ms. Output is
coalesced into ``log_chunk`` messages of at most CHUNK_BYTES, at most CHUNKS_PER_S a second and
BYTES_PER_S bytes a second per lease: a container printing in a tight loop must not saturate
the agent's only connection, so beyond that output is dropped and a marker says how much.
CHUNKS_PER_S full chunks carry more than BYTES_PER_S, so the byte budget is the one that binds:
a burst within it waits a moment instead of being dropped.
Chunks reach the agent's outbox through ``emit``, which hands them to the event loop.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from supplier_agent.protocol import LOG_FOLLOW_TTL_S, MAX_LOG_CHUNK_BYTES, LogChunk

log = logging.getLogger("cloudgpu.agent.logs")

CHUNK_BYTES = MAX_LOG_CHUNK_BYTES
FLUSH_INTERVAL_S = 0.2
CHUNKS_PER_S = 10
BYTES_PER_S = 64 * 1024

# (bytes read from the container) -> None; called from the reader thread.
LogSink = Callable[[bytes], None]


class LogSource(Protocol):
    def follow_logs(self, lease_id: str, tail: int, sink: LogSink, stop: threading.Event) -> None:
        """Blocking: feed ``sink`` the container's output until it exits or ``stop`` is set.
        Raises ``CommandFailed`` when the lease has no container to follow."""
        ...


def dropped_marker(count: int) -> str:
    return f"\n[... {count} bytes dropped ...]\n"


def _escaped_size(text: str) -> int:
    # What the text costs inside a JSON frame: control characters escape to six bytes.
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", errors="surrogatepass")) - 2


def split_for_frames(text: str, limit: int = MAX_LOG_CHUNK_BYTES) -> list[str]:
    """Pieces of ``text`` that each fit ``limit`` both as UTF-8 and JSON-escaped."""
    if _escaped_size(text) <= limit:
        return [text] if text else []
    half = len(text) // 2
    return split_for_frames(text[:half], limit) + split_for_frames(text[half:], limit)


class LogPump:
    """Coalescing and rate limiting for one lease; ``feed`` and ``flush`` from any thread.

    Admission follows the byte budget (a token bucket of one second's worth); what is admitted
    waits, up to one second's budget, and leaves in chunks of at most ``chunk_bytes``, at most
    ``chunks_per_s`` of them a second. Chunks may carry more than the budget's share of a
    second, so a burst within the budget (64 KiB at once, once a second) is delayed a few
    tenths of a second, not dropped.
    """

    def __init__(
        self,
        emit: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        chunk_bytes: int = CHUNK_BYTES,
        chunks_per_s: int = CHUNKS_PER_S,
        bytes_per_s: int = BYTES_PER_S,
    ) -> None:
        self._emit = emit
        self._clock = clock
        self._chunk_bytes = chunk_bytes
        self.min_gap_s = 1.0 / chunks_per_s
        self._bytes_per_s = bytes_per_s
        self._lock = threading.Lock()
        self._text = ""  # admitted output and markers, decoded, waiting to leave
        self._dropped = 0
        self._allowance = float(bytes_per_s)  # token bucket, one second's worth at most
        self._refilled_at = clock()
        self._flushed_at = -1e9
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> None:
        with self._lock:
            now = self._clock()
            self._allowance = min(
                float(self._bytes_per_s),
                self._allowance + (now - self._refilled_at) * self._bytes_per_s,
            )
            self._refilled_at = now
            # The wait is bounded too: if chunks cannot leave (a stalled flusher), drop.
            room = max(0, self._bytes_per_s - len(self._text))
            taken = min(len(data), int(self._allowance), room)
            if taken:
                if self._dropped:
                    self._mark_dropped()
                self._text += self._decoder.decode(data[:taken])
                self._allowance -= taken
            self._dropped += len(data) - taken
            if len(self._text) >= self._chunk_bytes:
                self._flush_locked(now)

    def flush(self, *, final: bool = False) -> bool:
        """Send what is due; True while output is still waiting (call again in min_gap_s)."""
        with self._lock:
            if self._dropped:
                self._mark_dropped()
            if final:
                self._text += self._decoder.decode(b"", final=True)
            self._flush_locked(self._clock(), final=final)
            return bool(self._text)

    def _mark_dropped(self) -> None:
        self._text += dropped_marker(self._dropped)
        self._dropped = 0

    def _flush_locked(self, now: float, *, final: bool = False) -> None:
        """Emit one chunk (everything when ``final``) unless the chunk rate forbids it."""
        if not self._text or (not final and now - self._flushed_at < self.min_gap_s):
            return
        self._flushed_at = now
        if final:
            text, self._text = self._text, ""
            for piece in split_for_frames(text, self._chunk_bytes):
                self._emit(piece)
            return
        piece = _head(self._text, self._chunk_bytes)
        self._text = self._text[len(piece) :]
        self._emit(piece)


def _head(text: str, limit: int) -> str:
    """The longest start of ``text`` (to a few bytes) that fits ``limit`` in a JSON frame."""
    size = min(len(text), limit)
    while size > 1:
        escaped = _escaped_size(text[:size])
        if escaped <= limit:
            break
        size = max(1, size * limit // escaped - 1)
    return text[:size]


@dataclass
class _Follower:
    stop: threading.Event
    deadline: float
    threads: list[threading.Thread] = field(default_factory=list)


class LogFollowers:
    """The agent's followers, one per lease. ``send`` must be thread-safe (it hands messages
    to the event loop); ``on_error`` reports a lease that could not be followed."""

    def __init__(
        self,
        source: LogSource,
        send: Callable[[LogChunk], None],
        on_error: Callable[[str, str], None],
        *,
        ttl_s: float = LOG_FOLLOW_TTL_S,
    ) -> None:
        self._source = source
        self._send = send
        self._on_error = on_error
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._followers: dict[str, _Follower] = {}
        # One counter for every lease, not one per lease: nothing to forget when a lease ends
        # (20,000 leases later the agent still holds one integer).
        self._last_seq = 0

    def following(self) -> set[str]:
        with self._lock:
            return set(self._followers)

    def follow(self, lease_id: str, tail: int) -> None:
        """Start following the lease, or push its deadline out if it is followed already."""
        deadline = time.monotonic() + self._ttl_s
        with self._lock:
            current = self._followers.get(lease_id)
            if current is not None and not current.stop.is_set():
                current.deadline = deadline
                return
            follower = _Follower(stop=threading.Event(), deadline=deadline)
            self._followers[lease_id] = follower
        pump = LogPump(lambda text: self._emit(lease_id, text))
        reader = threading.Thread(
            target=self._read, args=(lease_id, tail, pump, follower), daemon=True
        )
        flusher = threading.Thread(target=self._tick, args=(pump, follower), daemon=True)
        follower.threads = [reader, flusher]
        reader.start()
        flusher.start()

    @contextlib.contextmanager
    def streaming(self, lease_id: str) -> Iterator[LogSink]:
        """A sink whose bytes leave as the lease's ``log_chunk`` frames, with a follower's
        budget and pacing, until the block ends (then what waits is flushed).

        For output that is not the container's own log, such as the warm-up's ``docker exec``
        while the lease starts: the hub keeps it in the lease's backlog and a page that follows
        the lease shows it as it comes, before the lease runs.
        """
        pump = LogPump(lambda text: self._emit(lease_id, text))
        done = threading.Event()

        def tick() -> None:
            waiting = False
            while not done.wait(pump.min_gap_s if waiting else FLUSH_INTERVAL_S):
                waiting = pump.flush()

        flusher = threading.Thread(target=tick, daemon=True, name=f"log-stream-{lease_id[:8]}")
        flusher.start()
        try:
            yield pump.feed
        finally:
            done.set()
            flusher.join(timeout=10)
            pump.flush(final=True)

    def stop(self, lease_id: str) -> None:
        with self._lock:
            follower = self._followers.pop(lease_id, None)
        if follower is not None:
            follower.stop.set()

    def stop_all(self) -> None:
        with self._lock:
            followers, self._followers = list(self._followers.values()), {}
        for follower in followers:
            follower.stop.set()

    def _emit(self, lease_id: str, text: str) -> None:
        with self._lock:
            # Milliseconds since the epoch as a floor: seq keeps growing across agent restarts,
            # so the hub and the renter's page can drop chunks they have seen already.
            seq = max(self._last_seq + 1, int(time.time() * 1000))
            self._last_seq = seq
        self._send(LogChunk(lease_id=lease_id, seq=seq, data=text))

    def _read(self, lease_id: str, tail: int, pump: LogPump, follower: _Follower) -> None:
        try:
            self._source.follow_logs(lease_id, tail, pump.feed, follower.stop)
        except Exception as exc:  # CommandFailed, or an engine error mid-stream
            if not follower.stop.is_set():
                log.info("cannot follow the logs of lease %s: %s", lease_id, exc)
                self._on_error(lease_id, str(exc))
        finally:
            follower.stop.set()
            with self._lock:
                if self._followers.get(lease_id) is follower:
                    del self._followers[lease_id]

    def _tick(self, pump: LogPump, follower: _Follower) -> None:
        waiting = False
        # Sooner while output waits (a burst): one chunk per gap drains it within the second.
        while not follower.stop.wait(pump.min_gap_s if waiting else FLUSH_INTERVAL_S):
            waiting = pump.flush()
            if time.monotonic() > follower.deadline:
                follower.stop.set()  # nobody renewed: nobody is watching
        follower.threads[0].join(timeout=10)
        pump.flush(final=True)
