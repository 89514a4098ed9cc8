"""A registration queued behind others (a reconnect storm) whose client has left is dropped
when its turn comes, instead of costing a registration nobody reads (consumer.py,
_handshake_step). Through Channels' WebsocketCommunicator, on the real database and Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from hub.agents import consumer
from hub.suppliers.models import Host
from tests.hub import factories as f
from tests.hub.agents.test_agent_socket import _connect, _register, _supplier_token

pytestmark = pytest.mark.django_db(transaction=True)


@asynccontextmanager
async def _storm_ahead() -> AsyncIterator[None]:
    """Every handshake slot of this event loop held, as by registrations ahead in a storm;
    they drain on leaving the block."""
    slots = consumer._slots()
    for _ in range(settings.AGENT_DB_THREADS):
        await slots.acquire()
    try:
        yield
    finally:
        for _ in range(settings.AGENT_DB_THREADS):
            slots.release()


def _host_exists(agent_id: str) -> bool:
    return Host.objects.filter(agent_id=agent_id).exists()


async def test_a_queued_registration_whose_client_left_is_dropped() -> None:
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    dropped_before = consumer.dropped_handshake_steps
    with f.private_redis_keys():
        communicator = await _connect(plaintext)
        assert (await communicator.connect())[0]
        async with _storm_ahead():
            await communicator.send_to(text_data=_register(agent_id))
            await communicator.send_input({"type": "websocket.disconnect", "code": 1006})
        await communicator.wait(timeout=10)

    assert not await database_sync_to_async(_host_exists)(agent_id)
    assert consumer.dropped_handshake_steps == dropped_before + 1


async def test_a_queued_registration_whose_client_stays_is_answered() -> None:
    # The control: the same queue, the client still there.
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    with f.private_redis_keys():
        communicator = await _connect(plaintext)
        assert (await communicator.connect())[0]
        async with _storm_ahead():
            await communicator.send_to(text_data=_register(agent_id))
        reply = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()

    assert reply["type"] == "welcome"
    assert await database_sync_to_async(_host_exists)(agent_id)
