"""The dashboard's live socket through Channels' WebsocketCommunicator: Origin and session
checks, and state changes pushed without asking."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from hub.asgi import application
from hub.leases import logs as lease_logs
from hub.leases.models import Lease
from hub.suppliers import liveness
from hub.suppliers.models import Host
from supplier_agent.protocol import LogChunk
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


async def test_a_renter_follows_the_live_output_of_their_own_lease_only() -> None:
    host = await database_sync_to_async(f.register_host)()
    layer = get_channel_layer()
    agent_channel = await layer.new_channel()  # stands in for the agent's socket
    await database_sync_to_async(
        lambda: Host.objects.filter(pk=host.pk).update(channel_name=agent_channel)
    )()
    lease = await database_sync_to_async(f.run_lease)(host)
    other_lease = await database_sync_to_async(f.start_lease)(
        await database_sync_to_async(f.register_host)()
    )
    renter = await database_sync_to_async(lambda: lease.renter)()
    lease_id = str(lease.pk)
    await lease_logs.publish(LogChunk(lease_id=lease_id, seq=1, data="kept line\n"))
    cookie = await database_sync_to_async(_session_cookie)(renter)
    socket = _socket([(b"origin", ORIGIN), (b"cookie", cookie)])
    try:
        assert (await socket.connect())[0]
        assert (await socket.receive_json_from(timeout=5))["type"] == "snapshot"

        await socket.send_json_to({"type": "logs.subscribe", "lease_id": str(other_lease.pk)})
        refused = await socket.receive_json_from(timeout=5)
        assert refused == {
            "type": "error",
            "lease_id": str(other_lease.pk),
            "reason": "no such lease",
        }

        await socket.send_json_to({"type": "logs.subscribe", "lease_id": lease_id})
        backlog = await socket.receive_json_from(timeout=5)
        assert backlog == {
            "type": "log",
            "lease_id": lease_id,
            "seq": 1,
            "data": "kept line\n",
            "backlog": True,
        }
        # The agent is asked to follow (the agent socket forwards the frame as it is).
        command = await asyncio.wait_for(layer.receive(agent_channel), timeout=5)
        assert command["type"] == "agent.command"
        assert json.loads(command["frame"]) == {
            "type": "logs",
            "v": 1,
            "lease_id": lease_id,
            "follow": True,
            "tail": 0,
        }

        await lease_logs.publish(LogChunk(lease_id=lease_id, seq=1, data="kept line\n"))
        await lease_logs.publish(LogChunk(lease_id=lease_id, seq=2, data="live line\n"))
        await lease_logs.publish(LogChunk(lease_id=str(other_lease.pk), seq=3, data="secret\n"))
        live = await socket.receive_json_from(timeout=5)  # the repeated seq 1 is dropped
        assert live == {"type": "log", "lease_id": lease_id, "seq": 2, "data": "live line\n"}
        await socket.send_json_to({"type": "logs.unsubscribe", "lease_id": lease_id})
        await lease_logs.publish(LogChunk(lease_id=lease_id, seq=4, data="after\n"))
        assert await socket.receive_nothing(timeout=1)
    finally:
        await socket.disconnect()
        for key in (lease_id, str(other_lease.pk)):
            liveness.sync_client().delete(lease_logs.backlog_key(key))


async def test_warm_up_output_reaches_a_page_opened_while_the_lease_starts() -> None:
    # Issue 21 item 2: the agent streams the warm-up's output before the lease runs. The page
    # shows it live; once the lease runs, the agent's first follow still asks for the
    # container's own first lines (the backlog held only the warm-up's).
    host = await database_sync_to_async(f.register_host)()
    layer = get_channel_layer()
    agent_channel = await layer.new_channel()
    await database_sync_to_async(
        lambda: Host.objects.filter(pk=host.pk).update(channel_name=agent_channel)
    )()
    lease = await database_sync_to_async(f.start_lease)(host)
    renter = await database_sync_to_async(lambda: lease.renter)()
    lease_id = str(lease.pk)
    cookie = await database_sync_to_async(_session_cookie)(renter)
    socket = _socket([(b"origin", ORIGIN), (b"cookie", cookie)])
    try:
        assert (await socket.connect())[0]
        assert (await socket.receive_json_from(timeout=5))["type"] == "snapshot"
        await socket.send_json_to({"type": "logs.subscribe", "lease_id": lease_id})
        assert (await socket.receive_json_from(timeout=5))["backlog"] is True

        await lease_logs.publish(LogChunk(lease_id=lease_id, seq=5, data="[warm-up] make\n"))
        live = await socket.receive_json_from(timeout=5)
        assert live == {"type": "log", "lease_id": lease_id, "seq": 5, "data": "[warm-up] make\n"}
        assert await database_sync_to_async(lambda: Lease.objects.get(pk=lease_id).state)() in {
            Lease.State.PENDING,
            Lease.State.RESERVING,
            Lease.State.STARTING,
        }

        await database_sync_to_async(
            lambda: Lease.objects.filter(pk=lease_id).update(state=Lease.State.RUNNING)
        )()
        await socket.send_json_to({"type": "logs.subscribe", "lease_id": lease_id})  # live.js
        command = await asyncio.wait_for(layer.receive(agent_channel), timeout=5)
        assert json.loads(command["frame"])["tail"] == lease_logs.FIRST_TAIL_LINES
        await socket.send_json_to({"type": "logs.subscribe", "lease_id": lease_id})
        command = await asyncio.wait_for(layer.receive(agent_channel), timeout=5)
        assert json.loads(command["frame"])["tail"] == 0  # once: the follower has them now
    finally:
        await socket.disconnect()
        liveness.sync_client().delete(lease_logs.backlog_key(lease_id))


async def test_another_port_of_the_same_host_is_a_foreign_origin() -> None:
    user = await database_sync_to_async(f.make_user)("renter")
    cookie = await database_sync_to_async(_session_cookie)(user)
    for origin in (b"http://127.0.0.1:8001", b"https://127.0.0.1:8000", b"http://127.0.0.1"):
        socket = _socket([(b"origin", origin), (b"cookie", cookie)])
        connected, _ = await socket.connect()
        assert not connected, origin


async def test_logging_out_closes_the_live_socket() -> None:
    user = await database_sync_to_async(f.make_user)("renter")
    client = Client()
    await database_sync_to_async(client.force_login)(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    socket = _socket([(b"origin", ORIGIN), (b"cookie", cookie)])
    connected, _ = await socket.connect()
    assert connected
    await socket.receive_json_from(timeout=5)  # the first snapshot

    logout = await database_sync_to_async(client.post)("/logout/")
    assert logout.status_code == 302

    closed = None
    while closed is None:
        output = await socket.receive_output(timeout=5)
        if output["type"] == "websocket.close":
            closed = output
    assert closed["code"] == 4401
    await socket.disconnect()


async def test_on_a_loopback_hub_localhost_is_the_same_origin() -> None:
    user = await database_sync_to_async(f.make_user)("renter")
    cookie = await database_sync_to_async(_session_cookie)(user)
    socket = _socket([(b"origin", b"http://localhost:8000"), (b"cookie", cookie)])
    connected, _ = await socket.connect()
    assert connected
    await socket.disconnect()
