"""glibc's arenas capped and freed pages given back in the agent (supplier_agent/native_memory.py,
issue 23): threads that come and go with leases no longer each keep a heap of their own."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap

import pytest

from supplier_agent import native_memory
from tests.support.loops import run_on_own_loop
from tests.support.processes import REPO_ROOT

# Eight threads alive at once, each allocating from malloc (64 KiB: below the mmap threshold,
# above pymalloc's), then glibc's malloc_stats, which prints one "Arena N:" per arena.
_PROBE = textwrap.dedent(
    """
    import ctypes, ctypes.util, sys, threading
    from supplier_agent import native_memory
    if sys.argv[1] == "limit":
        assert native_memory.limit_arenas(), "the cap was not set"
    held = []
    start = threading.Barrier(8)
    def work():
        start.wait()  # all alive together: none can take over an arena another one left
        held.append(bytearray(64 * 1024))
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_stats()
    """
)


def _arenas(mode: str, env: dict[str, str] | None = None) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return sum(line.startswith("Arena ") for line in done.stderr.splitlines())


@pytest.mark.skipif(native_memory._glibc() is None, reason="not glibc")
def test_the_cap_keeps_eight_threads_to_two_arenas() -> None:
    env = {k: v for k, v in os.environ.items() if k != native_memory.ENV}
    assert _arenas("none", env) > native_memory.ARENAS  # what the threads take uncapped
    assert _arenas("limit", env) == native_memory.ARENAS


def test_an_operators_malloc_arena_max_wins() -> None:
    assert native_memory.limit_arenas(env={native_memory.ENV: "4"}) is False


@pytest.mark.skipif(native_memory._glibc() is None, reason="not glibc")
def test_trim_gives_back_the_pages_of_holes_free_cannot() -> None:
    # 64 MiB in 64 KiB blocks with every tenth kept: free() can only shrink the heap's top,
    # so the holes below the kept blocks stay mapped until malloc_trim releases their pages.
    blocks = [bytearray(64 * 1024) for _ in range(1024)]
    kept = blocks[::10]
    del blocks
    assert native_memory.trim() is True
    assert len(kept) == 103


def test_trims_run_on_schedule_until_stop_and_survive_a_failing_trim() -> None:
    calls: list[int] = []

    def trim() -> bool:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the C library says no")
        return True

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(native_memory.trim_periodically(stop, every_s=0.01, trim=trim))
        deadline = asyncio.get_running_loop().time() + 10
        while len(calls) < 4:
            assert asyncio.get_running_loop().time() < deadline, "trims stopped"
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=10)

    run_on_own_loop(scenario())
    assert len(calls) >= 4  # the failing second one did not end the loop
