"""Channel-layer sends from synchronous code (Celery tasks, views, services) on one event loop
that lives as long as the process.

``async_to_sync(layer.send)(...)`` in a thread with no event loop runs each call on a brand-new
loop. channels_redis keeps its Redis pools per loop (``RedisChannelLayer.connection`` looks the
pool up in ``_layers[asyncio.get_running_loop()]``) and wraps ``loop.close()`` to close them, so
every such call connected to Redis, sent, and hung up again, on top of the loop's own setup.
Submitting every send to one long-lived loop keeps one pool on the process-wide layer object,
and its connection is reused. Those channels_redis internals, and the upstream issues behind
them: hub.lib.compat_channels_redis (whose tests fail if a release changes them).

The web process has a loop already, Daphne's, which holds the layer's pool for its sockets:
there ``use_loop`` makes sync code (views, the agent sockets' database threads) submit to that
loop instead, so the process keeps one pool, not two (issue 18: at most two Redis connections
per process). hub.lib.shared_redis runs the hub's own synchronous Redis commands the same way.

Async code must not come here: it awaits the layer itself, on its own loop and pool.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from channels.layers import BaseChannelLayer, get_channel_layer

SEND_TIMEOUT_S = 10.0

T = TypeVar("T")


class CalledFromEventLoop(RuntimeError):
    """A blocking send was attempted on a thread that runs an event loop."""


class ChannelSendTimeout(TimeoutError):
    """The channel layer did not finish a send in time (Redis slow or unreachable)."""


class _LoopThread:
    """One event loop, the daemon thread that runs it, and the process that started both."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        # Daemon: a process that never calls close() (a Celery child killed by its parent)
        # must still be able to exit.
        self.thread = threading.Thread(target=self._run, name="channel-send-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            # channels_redis's wrapper of close() closes the pools it keyed by this loop.
            self.loop.close()

    def stop(self, timeout_s: float) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout_s)


_lock = threading.Lock()
_runner: _LoopThread | None = None
# Loops inherited through fork(): their thread stayed in the parent. Kept referenced, because a
# collected loop that still looks running warns, and its sockets belong to the parent.
_inherited: list[_LoopThread] = []


def _reset_lock_in_child() -> None:
    global _lock
    # Another thread may have held the lock at fork(); in the child it would stay held forever.
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_lock_in_child)


# The web process's own loop (Daphne's), once it says so: (the pid that set it, the loop).
_home: tuple[int, asyncio.AbstractEventLoop] | None = None


def use_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Run this process's sync sends and Redis calls on ``loop`` (a loop that runs for the
    process's whole life, Daphne's) rather than on a thread of their own."""
    global _home
    _home = (os.getpid(), loop)


def _loop() -> asyncio.AbstractEventLoop:
    global _runner
    home = _home
    # Not before it runs (a call would wait for ever) nor after it stopped, nor in a child
    # forked from the process that set it.
    if home is not None and home[0] == os.getpid() and home[1].is_running():
        return home[1]
    runner = _runner
    if runner is not None and runner.pid == os.getpid():
        return runner.loop
    with _lock:
        if _runner is None or _runner.pid != os.getpid():
            # After a fork (Celery's prefork pool) the child inherits the loop but not the thread
            # that runs it: a coroutine submitted there would never run.
            if _runner is not None:
                _inherited.append(_runner)
            _runner = _LoopThread()
        return _runner.loop


def _refuse_inside_event_loop(what: str, target: asyncio.AbstractEventLoop | None = None) -> None:
    """Refuse on a thread that runs an event loop; with ``target``, only on ``target``'s."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        return
    if target is not None and running is not target:
        return
    # Blocking this thread on a future would stall its own loop, and if it is our loop thread,
    # deadlock: the coroutine could never run.
    raise CalledFromEventLoop(
        f"channel_send.{what}() blocks and cannot run inside an event loop; "
        f"await get_channel_layer().{what}(...) directly instead"
    )


def call(
    what: str,
    work: Callable[[BaseChannelLayer], Coroutine[Any, Any, T]],
    timeout_s: float = SEND_TIMEOUT_S,
    *,
    from_other_loops: bool = False,
) -> T:
    """Run ``work(layer)`` on this process's loop and return its result (blocking). ``what``
    names it in errors. Raises ChannelSendTimeout after ``timeout_s``. ``from_other_loops``:
    a thread that runs another event loop may call too (and blocks that loop meanwhile, as a
    sync Redis client would: tests' async bodies); on the target loop itself it never may."""
    loop = _loop()
    _refuse_inside_event_loop(what, loop if from_other_loops else None)
    # The process-wide layer object: its pool for our loop is created on first use and then
    # reused (override_settings in tests swaps the object, which then gets a pool of its own).
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer is configured (settings.CHANNEL_LAYERS)")
    future = asyncio.run_coroutine_threadsafe(work(layer), loop)
    done, _ = concurrent.futures.wait([future], timeout=timeout_s)
    if not done:
        future.cancel()
        raise ChannelSendTimeout(f"channel layer {what} did not finish within {timeout_s:g} s")
    # Re-raises what the layer raised (a Redis error, ChannelFull).
    return future.result()


def send(channel: str, message: dict[str, Any], *, timeout_s: float = SEND_TIMEOUT_S) -> None:
    """Send ``message`` to one channel from synchronous code; returns once Redis has it."""
    call("send", lambda layer: layer.send(channel, message), timeout_s)


def group_send(group: str, message: dict[str, Any], *, timeout_s: float = SEND_TIMEOUT_S) -> None:
    """Send ``message`` to every channel of ``group`` from synchronous code."""
    call("group_send", lambda layer: layer.group_send(group, message), timeout_s)


def close(timeout_s: float = SEND_TIMEOUT_S) -> None:
    """Stop this process's loop and close the Redis connections the layer opened on it.

    The next send starts a new loop. Runs at exit, so Redis sees a clean disconnect.
    """
    global _runner
    with _lock:
        runner, _runner = _runner, None
    if runner is not None and runner.pid == os.getpid():
        runner.stop(timeout_s)


atexit.register(close)
