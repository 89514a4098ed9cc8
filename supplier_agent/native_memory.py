"""glibc's heap in an agent that runs for months (issue 23).

A traced soak (docs/benchmarks.md, "The agent traced") found the agent's Python objects level
while its RSS kept growing about 1 MiB an hour: the rest was native. The agent runs each log
follower and the Docker SDK's calls in threads that come and go with leases, and glibc gives
each new thread its own heap arena, up to 8 per core, each keeping the pages its thread freed.
So the agent caps the arenas at ``ARENAS`` (the threads share them; they are mostly waiting on
sockets, so the lock is not contended) and gives freed pages back with ``malloc_trim`` every
``TRIM_EVERY_S``.

Measured after (docs/benchmarks.md, "85 minutes with the agent's arenas capped"): at the soak's
12 threads the agent's slope did not change (+1.07 MiB/h against +1.05); what it keeps is ~4 KiB
per lease, bounded by the remembered answers' cap. The cap stays as the bound for a host whose
many leases run many threads, where glibc alone would allow 8 arenas per core.

``MALLOC_ARENA_MAX`` in the environment wins: glibc reads it itself, and an operator who set it
meant it. Elsewhere than glibc (musl) both are no-ops.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable, Mapping

ARENAS = 2
TRIM_EVERY_S = 600.0
# mallopt's parameter number for the arena cap, from glibc's <malloc.h>.
M_ARENA_MAX = -8
ENV = "MALLOC_ARENA_MAX"

log = logging.getLogger("cloudgpu.agent")


def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):  # musl has no mallopt nor malloc_trim
        return None
    return libc


def limit_arenas(arenas: int = ARENAS, env: Mapping[str, str] = os.environ) -> bool:
    """Cap glibc's arenas; call before the process starts threads. True when the cap is set
    here, False where the environment already sets one or the C library has no such knob."""
    if ENV in env:
        return False
    libc = _glibc()
    return libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1


def trim() -> bool:
    """Give freed heap pages back to the system; True when glibc released some."""
    libc = _glibc()
    return libc is not None and libc.malloc_trim(0) == 1


async def trim_periodically(
    stop: asyncio.Event, every_s: float = TRIM_EVERY_S, trim: Callable[[], bool] = trim
) -> None:
    """``trim`` every ``every_s`` until ``stop``. A trim of a few tens of MiB takes well under
    a millisecond, so it runs on the event loop."""
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every_s)
        if stop.is_set():
            return
        try:
            trim()
        except Exception:  # a C library surprise must not end the agent
            log.exception("malloc_trim failed")
