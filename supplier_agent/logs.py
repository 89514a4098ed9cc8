"""Live container logs: one follower per lease, started (or renewed) by the hub's ``logs``.

A follower is a thread that reads the runtime's blocking log stream and a second one that
flushes what was read, so output that trickles in still leaves within ~200 ms. Output is
coalesced into ``log_chunk`` messages of at most CHUNK_BYTES, at most CHUNKS_PER_S a second and
BYTES_PER_S bytes a second per lease: a container printing in a tight loop must not saturate
the agent's only connection, so beyond that output is dropped and a marker says how much.
Chunks reach the agent's outbox through ``emit``, which hands them to the event loop.
"""

from __future__ import annotations

import codecs
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from supplier_agent.protocol import LOG_FOLLOW_TTL_S, MAX_LOG_CHUNK_BYTES, LogChunk

log = logging.getLogger("cloudgpu.agent.logs")

CHUNK_BYTES = 8 * 1024
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
    """Coalescing and rate limiting for one lease; ``feed`` and ``flush`` from any thread."""

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
        self._min_gap_s = 1.0 / chunks_per_s
        self._bytes_per_s = bytes_per_s
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._pending_text = ""  # markers, already text
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
            while data:
                room = min(int(self._allowance), self._chunk_bytes - len(self._buffer))
                if room <= 0:
                    # A full buffer goes out if the chunk rate allows; no allowance: drop.
                    if self._allowance >= 1 and self._flush_locked(now):
                        continue
                    break
                if self._dropped:
                    self._mark_dropped()
                self._buffer += data[:room]
                self._allowance -= min(room, len(data))
                data = data[room:]
            self._dropped += len(data)
            if len(self._buffer) >= self._chunk_bytes:
                self._flush_locked(now)

    def flush(self, *, final: bool = False) -> None:
        with self._lock:
            if self._dropped:
                self._mark_dropped()
            self._flush_locked(self._clock(), final=final)

    def _mark_dropped(self) -> None:
        self._pending_text += self._decode(final=False) + dropped_marker(self._dropped)
        self._dropped = 0

    def _decode(self, *, final: bool) -> str:
        text = self._decoder.decode(bytes(self._buffer), final=final)
        self._buffer.clear()
        return text

    def _flush_locked(self, now: float, *, final: bool = False) -> bool:
        """Emit what is buffered unless the chunk rate forbids it; True if the buffer is free."""
        if not self._buffer and not self._pending_text:
            return True
        if not final and now - self._flushed_at < self._min_gap_s:
            return False
        text = self._pending_text + self._decode(final=final)
        self._pending_text = ""
        self._flushed_at = now
        for piece in split_for_frames(text):
            self._emit(piece)
        return True


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
        self._last_seq: dict[str, int] = {}

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
            seq = max(self._last_seq.get(lease_id, 0) + 1, int(time.time() * 1000))
            self._last_seq[lease_id] = seq
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
        while not follower.stop.wait(FLUSH_INTERVAL_S):
            pump.flush()
            if time.monotonic() > follower.deadline:
                follower.stop.set()  # nobody renewed: nobody is watching
        follower.threads[0].join(timeout=10)
        pump.flush(final=True)
