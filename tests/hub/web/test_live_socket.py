"""The dashboard's live socket through Channels' WebsocketCommunicator: Origin and session
checks, and state changes pushed without asking."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from hub.asgi import application
from hub.leases.models import Lease
from tests.hub import factories as f

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = b"http://127.0.0.1:8000"


def _session_cookie(user: Any) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def _socket(headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    return WebsocketCommunicator(
        application, "/ws/live/", headers=[(b"host", b"127.0.0.1"), *headers]
    )


async def test_a_foreign_origin_is_refused() -> None:
    user = await database_sync_to_async(f.make_user)("renter")
    cookie = await database_sync_to_async(_session_cookie)(user)
    socket = _socket([(b"origin", b"http://evil.example"), (b"cookie", cookie)])
    connected, _ = await socket.connect()
    assert not connected
    socket = _socket([(b"cookie", cookie)])  # no Origin at all
    connected, _ = await socket.connect()
    assert not connected


async def test_a_socket_without_a_session_is_refused() -> None:
    socket = _socket([(b"origin", ORIGIN)])
    connected, code = await socket.connect()
    assert not connected
    assert code == 4401


async def test_the_renter_gets_their_lease_states_and_changes_only() -> None:
    host = await database_sync_to_async(f.register_host)()
    lease = await database_sync_to_async(f.start_lease)(host)
    other_lease = await database_sync_to_async(f.start_lease)(
        await database_sync_to_async(f.register_host)()
    )
    renter = await database_sync_to_async(lambda: lease.renter)()
    cookie = await database_sync_to_async(_session_cookie)(renter)
    socket = _socket([(b"origin", ORIGIN), (b"cookie", cookie)])
    connected, _ = await socket.connect()
    assert connected
    first = await socket.receive_json_from(timeout=5)
    assert first["leases"][str(lease.pk)]["state"] == "reserving"
    assert str(other_lease.pk) not in first["leases"]
    await database_sync_to_async(
        lambda: Lease.objects.filter(pk=lease.pk).update(state=Lease.State.STARTING)
    )()
    changed = await socket.receive_json_from(timeout=5)
    assert changed["leases"][str(lease.pk)]["state"] == "starting"
    await socket.disconnect()
