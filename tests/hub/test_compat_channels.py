"""The Channels behaviour hub.lib.compat_channels copies is still upstream's.

A failure names what changed; re-check hub/lib/compat_channels.py when the channels pin
(requirements/hub.txt) moves.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import channels
import pytest
from channels.consumer import AsyncConsumer, get_handler_name
from channels.db import DatabaseSyncToAsync

from hub.lib.compat_channels import dispatch_without_db_cleanup


def _recheck(what: str) -> str:
    return (
        f"channels {channels.__version__}: {what} changed; re-check "
        "hub/lib/compat_channels.py (its docstring says why the agent consumer copies it)"
    )


def test_upstream_dispatch_is_still_the_handler_lookup_plus_the_db_cleanup_we_skip() -> None:
    source = inspect.getsource(AsyncConsumer.dispatch)
    body = [line.strip() for line in source.splitlines()[1:] if line.strip()]
    code = [line for line in body if not line.startswith(('"""', "Works out"))]
    assert code == [
        "handler = getattr(self, get_handler_name(message), None)",
        "if handler:",
        "await aclose_old_connections()",
        "await handler(message)",
        "else:",
        'raise ValueError("No handler for message type %s" % message["type"])',
    ], _recheck("AsyncConsumer.dispatch")


def test_database_sync_to_async_still_cleans_up_before_and_after_each_call() -> None:
    # What makes skipping the per-message clean-up safe for a consumer that reaches the
    # database only through database_sync_to_async.
    source = inspect.getsource(DatabaseSyncToAsync.thread_handler)
    assert source.count("close_old_connections()") == 2, _recheck(
        "DatabaseSyncToAsync.thread_handler's clean-up"
    )
    assert source.index("close_old_connections()") < source.index("super().thread_handler"), (
        _recheck("DatabaseSyncToAsync.thread_handler no longer cleans up before the call")
    )


def test_get_handler_name_still_maps_a_type_to_a_method_name_and_refuses_private_ones() -> None:
    assert list(inspect.signature(get_handler_name).parameters) == ["message"], _recheck(
        "get_handler_name's signature"
    )
    assert get_handler_name({"type": "lease.log"}) == "lease_log", _recheck("get_handler_name")
    with pytest.raises(ValueError, match="leading underscore"):
        get_handler_name({"type": "_private"})


class _Consumer(AsyncConsumer):
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def lease_log(self, message: dict[str, Any]) -> None:
        self.seen.append(message)


def test_dispatch_without_db_cleanup_routes_like_upstream_and_refuses_unknown_types() -> None:
    consumer = _Consumer()
    # A loop of its own, never installed as the thread's: asyncio.run() would reset the
    # thread's loop on exit and orphan the one pytest-asyncio keeps (its socket pair then
    # surfaces as a ResourceWarning in whichever later test collects garbage).
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(
            dispatch_without_db_cleanup(consumer, {"type": "lease.log", "seq": 1})
        )
        assert consumer.seen == [{"type": "lease.log", "seq": 1}]
        with pytest.raises(ValueError, match=r"No handler for message type lease\.gone"):
            loop.run_until_complete(dispatch_without_db_cleanup(consumer, {"type": "lease.gone"}))
    finally:
        loop.close()
