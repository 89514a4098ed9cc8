"""Running a coroutine from a plain test on an event loop of its own.

Not ``asyncio.run()``: on exit it sets the thread's event loop to None, which orphans the loop
pytest-asyncio keeps for the session's async tests; that loop's self-pipe (a socket pair) then
surfaces as an unclosed-socket ResourceWarning in whichever later test collects garbage, an
error under the project's warnings-as-errors. This loop is never installed as the thread's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_on_own_loop(coro: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        # What asyncio.run does on the way out: no task, async generator or executor thread
        # outlives the loop.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
