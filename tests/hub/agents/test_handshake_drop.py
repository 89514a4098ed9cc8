"""Handshake work queued behind others (a reconnect storm) whose client has left is dropped
when its turn comes, instead of costing queries nobody reads: the token check of a new socket
(consumer.py, _handshake_step) and a registration (registration_batch.py). Through Channels'
WebsocketCommunicator, on the real database and Redis."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from channels.db import database_sync_to_async
from django.conf import settings

from hub.agents import consumer, registration_batch
from hub.suppliers.models import Host
from tests.hub import factories as f
from tests.hub.agents.test_agent_socket import _connect, _register, _supplier_token

pytestmark = pytest.mark.django_db(transaction=True)


@asynccontextmanager
async def _token_checks_busy() -> AsyncIterator[None]:
    """Every token-check slot of this event loop held, as by a storm's sockets ahead."""
    slots = consumer._slots()
    for _ in range(settings.AGENT_DB_THREADS):
        await slots.acquire()
    try:
        yield
    finally:
        for _ in range(settings.AGENT_DB_THREADS):
            slots.release()


@asynccontextmanager
async def _batches_busy() -> AsyncIterator[None]:
    """Registration batches in flight at the limit (as in a storm); on leaving the block they
    finish and the waiting registrations form the next batch."""
    batcher = registration_batch._batchers.get(asyncio.get_running_loop())
    if batcher is None:
        batcher = registration_batch._batchers[asyncio.get_running_loop()] = (
            registration_batch._Batcher()
        )
    batcher._in_flight = registration_batch.IN_FLIGHT_MAX
    try:
        yield
    finally:
        batcher._in_flight = 0
        batcher._start(consumer._db)


def _host_exists(agent_id: str) -> bool:
    return Host.objects.filter(agent_id=agent_id).exists()


async def test_a_queued_token_check_whose_client_left_is_dropped() -> None:
    _, plaintext = await _supplier_token()
    dropped_before = consumer.dropped_handshake_steps
    communicator = await _connect(plaintext)
    async with _token_checks_busy():
        await communicator.send_input({"type": "websocket.connect"})
        await communicator.send_input({"type": "websocket.disconnect", "code": 1006})
    await communicator.wait(timeout=10)

    assert consumer.dropped_handshake_steps == dropped_before + 1
    assert await communicator.receive_nothing()  # never accepted


async def test_a_queued_registration_whose_client_left_is_dropped() -> None:
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    dropped_before = registration_batch.dropped
    with f.private_redis_keys():
        communicator = await _connect(plaintext)
        assert (await communicator.connect())[0]
        async with _batches_busy():
            await communicator.send_to(text_data=_register(agent_id))
            await communicator.send_input({"type": "websocket.disconnect", "code": 1006})
        await communicator.wait(timeout=10)

    assert not await database_sync_to_async(_host_exists)(agent_id)
    assert registration_batch.dropped == dropped_before + 1


async def test_a_queued_registration_whose_client_stays_is_answered() -> None:
    # The control: the same queue, the client still there.
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    with f.private_redis_keys():
        communicator = await _connect(plaintext)
        assert (await communicator.connect())[0]
        async with _batches_busy():
            await communicator.send_to(text_data=_register(agent_id))
        reply = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()

    assert reply["type"] == "welcome"
    assert await database_sync_to_async(_host_exists)(agent_id)
