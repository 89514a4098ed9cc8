"""The agent socket's gpu_health frames and its metrics: a failing GPU is delisted through the
socket; a connected agent counts in cloudgpu_agents_connected until it goes."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from channels.db import database_sync_to_async
from prometheus_client import REGISTRY

from hub.suppliers import liveness
from hub.suppliers.models import Gpu, Host
from tests.hub.agents.test_agent_socket import _registered, _supplier_token

pytestmark = pytest.mark.django_db(transaction=True)

UUID0 = "GPU-00000000-0000-4000-8000-000000000000"


def _connected() -> float:
    return REGISTRY.get_sample_value("cloudgpu_agents_connected") or 0.0


def _health(**fields: object) -> str:
    gpu = {"index": 0, "uuid": UUID0, **fields}
    return json.dumps({"type": "gpu_health", "v": 1, "gpus": [gpu]})


async def _wait_for(check: object, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while not await database_sync_to_async(check)():  # type: ignore[arg-type]
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_gpu_reported_lost_is_delisted_and_an_agent_counts_while_connected() -> None:
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    before = _connected()
    communicator, welcome = await _registered(plaintext, agent_id)
    assert _connected() == before + 1
    host_id = int(welcome["host_id"])
    # Healthy, or a program's own XID: nothing changes.
    await communicator.send_to(text_data=_health(xids=[13], xid_count=1))
    await communicator.send_to(text_data=_health(lost=True))
    await _wait_for(
        lambda: Gpu.objects.filter(host_id=host_id, unhealthy_since__isnull=False).exists(),
        "the lost GPU delisted",
    )
    gpu = await database_sync_to_async(Gpu.objects.get)(host_id=host_id, index=0)
    assert not gpu.listed
    assert "fell off the bus" in gpu.unhealthy_reason
    assert communicator.output_queue.empty()  # no error reply: the frame was understood
    await communicator.disconnect()
    assert _connected() == before
    liveness.forget(host_id)
    assert await database_sync_to_async(Host.objects.filter(pk=host_id).exists)()
