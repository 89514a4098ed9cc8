"""A chatty lease's kept output reaches its page through a real Daphne in bounded frames
(issue 23): one frame of it all passed Daphne's 1 MiB message limit and closed the socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from websockets.asyncio.client import connect

from hub.leases import logs as lease_logs
from hub.lib.ports import free_port, wait_for_port
from hub.suppliers import liveness
from tests.hub import factories as f
from tests.support import hub_stack
from tests.support.loops import run_on_own_loop
from tests.support.processes import hub_env, python_module, running

CHUNK_CHARS = 16_000  # near the protocol's 16 KiB per chunk


@pytest.fixture
def daphne(tmp_path: Path) -> Iterator[int]:
    port = free_port()
    env = hub_env(
        DATABASE_URL=hub_stack.test_database_url(),
        DEBUG="1",
        CSRF_TRUSTED_ORIGINS=f"http://127.0.0.1:{port}",
    )
    argv = python_module("hub.serve", "-b", "127.0.0.1", "-p", str(port), "hub.asgi:application")
    with running(argv, env=env, log=tmp_path / "web.log"):
        assert wait_for_port(port, timeout_s=60), "Daphne did not listen"
        yield port


def _keep(lease_id: str, texts: list[str]) -> None:
    """The backlog as hub/leases/logs.publish leaves it, written straight to Redis."""
    key = lease_logs.backlog_key(lease_id)
    client = liveness.sync_client()
    client.delete(key)
    entries = [json.dumps({"seq": n + 1, "data": text}) for n, text in enumerate(texts)]
    client.rpush(key, *entries)
    client.expire(key, 600)


async def _subscribe(port: int, cookie: str, lease_id: str, expected: str) -> list[dict[str, Any]]:
    """The log frames the page gets until it holds ``expected``; then the socket still answers."""
    async with connect(
        f"ws://127.0.0.1:{port}/ws/live/",
        origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
        additional_headers={"Cookie": cookie},
        max_size=None,  # whatever Daphne sends, the test sees it
    ) as socket:
        await socket.send(json.dumps({"type": "logs.subscribe", "lease_id": lease_id}))
        frames: list[dict[str, Any]] = []
        page = ""
        async with asyncio.timeout(30):
            while page != expected:
                raw = await socket.recv()
                message = json.loads(raw)
                if message["type"] != "log":
                    continue
                message["size"] = len(raw.encode())
                frames.append(message)
                page = ("" if message.get("backlog") else page) + message["data"]
            await socket.send(json.dumps({"type": "ping"}))
            while json.loads(await socket.recv())["type"] != "snapshot":
                pass
        return frames


# A real Daphne, as the end-to-end tests start it: its message limit is the point.
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
def test_more_than_a_mib_kept_reaches_the_page_in_bounded_frames(daphne: int) -> None:
    lease = f.start_lease(f.register_host())
    client = Client()
    client.force_login(lease.renter)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    lease_id = str(lease.pk)
    texts = [f"{n:05d} " + "x" * (CHUNK_CHARS - 7) + "\n" for n in range(lease_logs.BACKLOG_CHUNKS)]
    _keep(lease_id, texts)
    assert sum(map(len, texts)) > 1024 * 1024
    # The page shows at most BACKLOG_PAGE_CHARS: it is sent the newest chunks that fit.
    shown = lease_logs.BACKLOG_PAGE_CHARS // CHUNK_CHARS
    try:
        frames = run_on_own_loop(_subscribe(daphne, cookie, lease_id, "".join(texts[-shown:])))
    finally:
        liveness.sync_client().delete(lease_logs.backlog_key(lease_id))

    assert frames[0]["backlog"] is True
    assert all(not frame["backlog"] for frame in frames[1:])
    assert all(frame["size"] < lease_logs.BACKLOG_FRAME_BYTES + 1024 for frame in frames)
    assert frames[-1]["seq"] == lease_logs.BACKLOG_CHUNKS


def test_escaped_output_is_framed_by_its_size_on_the_wire() -> None:
    # Control characters cost six bytes each in JSON: 16 KiB of them is 96 KiB in a frame.
    entries = [{"seq": n, "data": "\x01" * 16384} for n in range(1, 13)]

    frames = lease_logs.page_frames(entries)

    assert "".join(text for _, text in frames) == "\x01" * 16384 * 12
    assert all(
        len(json.dumps(text).encode()) <= lease_logs.BACKLOG_FRAME_BYTES for _, text in frames
    )
    assert frames[-1][0] == 12
