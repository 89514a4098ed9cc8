"""The REST logs endpoint's megabytes are freed when the response is out, not at the next
full collection (issue 23): through the hub's real ASGI application, as Daphne drives it."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterator

import pytest
from asgiref.testing import ApplicationCommunicator
from channels.db import database_sync_to_async

from hub.accounts.api_tokens import create_api_token
from hub.asgi import application
from hub.leases import logs as lease_logs
from hub.suppliers import liveness
from tests.hub import factories as f

pytestmark = pytest.mark.django_db(transaction=True)

BIG = 256 * 1024


async def _get(path: str, token: str) -> tuple[int, int]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    app = ApplicationCommunicator(application, scope)
    await app.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await app.receive_output(10)
    size = 0
    while True:
        message = await app.receive_output(10)
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await app.send_input({"type": "http.disconnect"})  # what Daphne sends once it is out
    await app.wait(10)
    return start["status"], size


@pytest.fixture
def collector_off() -> Iterator[None]:
    """As between the web process's rare full collections."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


def _big_in_cycles() -> list[str]:
    """What the collector would free that holds a big string or bytes."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.collect()
    found = [
        f"{type(holder).__name__} -> {type(held).__name__} of {sys.getsizeof(held)} bytes"
        for holder in gc.garbage
        for held in gc.get_referents(holder)
        if isinstance(held, (bytes, str)) and sys.getsizeof(held) > BIG
    ]
    gc.set_debug(0)
    gc.garbage.clear()
    return found


async def test_the_log_text_and_its_body_leave_no_cycle(collector_off: None) -> None:
    lease = await database_sync_to_async(f.start_lease)(
        await database_sync_to_async(f.register_host)()
    )
    renter = await database_sync_to_async(lambda: lease.renter)()
    _, token = await database_sync_to_async(create_api_token)(renter, "reader")
    key = lease_logs.backlog_key(str(lease.pk))
    chunk = "y" * 16000
    liveness.sync_client().rpush(
        key, *[json.dumps({"seq": n, "data": chunk}) for n in range(1, 101)]
    )
    try:
        for _ in range(5):
            status, size = await _get(f"/api/v1/leases/{lease.pk}/logs/", token)
            assert status == 200
            assert size > 100 * 16000
        assert _big_in_cycles() == []
    finally:
        liveness.sync_client().delete(key)
