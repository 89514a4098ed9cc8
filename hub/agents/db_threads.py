"""The threads agent sockets' queries run on.

A small pool of threads, each with its own persistent connection (DATABASE_CONN_MAX_AGE), not
Channels' one thread-sensitive thread: there every registration of a web process queued behind
the others, round trip by round trip, which is what held a reconnect storm to ~7
registrations/s (docs/benchmarks.md). One socket's messages are still handled one at a time, so
its queries keep their order; rows two sockets share are locked by the services, as they must
be anyway against Celery.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import close_old_connections


@functools.cache
def _agent_db_threads() -> ThreadPoolExecutor:
    # Made on first use, not at import: AGENT_DB_THREADS is read when the process serves.
    return ThreadPoolExecutor(max_workers=settings.AGENT_DB_THREADS, thread_name_prefix="agent-db")


def in_db_thread(function: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``function`` as a coroutine function that runs on the agents' database threads."""

    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        finally:
            # Also inside the call's context: asgiref (3.13) runs the function in a copy of the
            # caller's context, and database_sync_to_async's own clean-up, outside it, was seen
            # to miss the connection the call opened (it stayed open past CONN_MAX_AGE).
            close_old_connections()

    wrapped: Callable[..., Awaitable[Any]] = database_sync_to_async(
        run, thread_sensitive=False, executor=_agent_db_threads()
    )
    return wrapped
