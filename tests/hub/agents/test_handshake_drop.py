"""Handshake work queued behind others (a reconnect storm) whose client has left is dropped
when its turn comes, instead of costing queries nobody reads: the token check of a new socket
(token_batch.py) and a registration (registration_batch.py), both batched by
hub/lib/group_commit.py. Through Channels' WebsocketCommunicator, on the real database and
Redis."""

from __future__ import annotations

import uuid

import pytest
from channels.db import database_sync_to_async
from prometheus_client import REGISTRY

from hub.agents import registration_batch, token_batch
from hub.suppliers.models import Host
from tests.hub import factories as f
from tests.hub.agents.test_agent_socket import _connect, _register, _supplier_token
from tests.support.batching import busy

pytestmark = pytest.mark.django_db(transaction=True)


def _counted(step: str) -> float:
    """The process's cloudgpu_agent_handshakes_dropped_total for one step (hub.lib.metrics)."""
    sample = REGISTRY.get_sample_value("cloudgpu_agent_handshakes_dropped_total", {"step": step})
    return sample or 0.0


def _host_exists(agent_id: str) -> bool:
    return Host.objects.filter(agent_id=agent_id).exists()


async def test_a_queued_token_check_whose_client_left_is_dropped() -> None:
    _, plaintext = await _supplier_token()
    dropped_before = token_batch.dropped()
    counted_before = _counted("token")
    communicator = await _connect(plaintext)
    async with busy(token_batch.batchers.get()):
        await communicator.send_input({"type": "websocket.connect"})
        await communicator.send_input({"type": "websocket.disconnect", "code": 1006})
    await communicator.wait(timeout=10)

    assert token_batch.dropped() == dropped_before + 1
    assert _counted("token") == counted_before + 1
    assert await communicator.receive_nothing()  # never accepted


async def test_a_queued_registration_whose_client_left_is_dropped() -> None:
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    dropped_before = registration_batch.dropped()
    counted_before = _counted("register")
    with f.private_redis_keys():
        communicator = await _connect(plaintext)
        assert (await communicator.connect())[0]
        async with busy(registration_batch.batchers.get()):
            await communicator.send_to(text_data=_register(agent_id))
            await communicator.send_input({"type": "websocket.disconnect", "code": 1006})
        await communicator.wait(timeout=10)

    assert not await database_sync_to_async(_host_exists)(agent_id)
    assert registration_batch.dropped() == dropped_before + 1
    assert _counted("register") == counted_before + 1


async def test_a_queued_registration_whose_client_stays_is_answered() -> None:
    # The control: the same queue, the client still there.
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    with f.private_redis_keys():
        communicator = await _connect(plaintext)
        assert (await communicator.connect())[0]
        async with busy(registration_batch.batchers.get()):
            await communicator.send_to(text_data=_register(agent_id))
        reply = await communicator.receive_json_from(timeout=10)
        await communicator.disconnect()

    assert reply["type"] == "welcome"
    assert await database_sync_to_async(_host_exists)(agent_id)
