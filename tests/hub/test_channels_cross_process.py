from __future__ import annotations

import json
from pathlib import Path

from websockets.asyncio.client import connect

from hub.lib.ports import free_port, wait_for_port
from tests.support.processes import hub_env, python_module, running


def _daphne(port: int) -> list[str]:
    return python_module(
        "daphne", "-b", "127.0.0.1", "-p", str(port), "tests.support.relay_asgi:application"
    )


async def test_send_from_one_daphne_reaches_consumer_held_by_another(tmp_path: Path) -> None:
    port_a, port_b = free_port(), free_port()
    env = hub_env()
    with (
        running(_daphne(port_a), env=env, log=tmp_path / "daphne-a.log") as daphne_a,
        running(_daphne(port_b), env=env, log=tmp_path / "daphne-b.log") as daphne_b,
    ):
        assert wait_for_port(port_a, timeout_s=60), "Daphne A did not listen"
        assert wait_for_port(port_b, timeout_s=60), "Daphne B did not listen"
        async with (
            connect(f"ws://127.0.0.1:{port_a}/relay/", open_timeout=30) as held_by_a,
            connect(f"ws://127.0.0.1:{port_b}/relay/", open_timeout=30) as held_by_b,
        ):
            hello_a = json.loads(await held_by_a.recv())
            hello_b = json.loads(await held_by_b.recv())
            assert hello_a["pid"] == daphne_a.pid
            assert hello_b["pid"] == daphne_b.pid

            await held_by_b.send(json.dumps({"to": hello_a["channel"], "text": "across"}))
            message = json.loads(await _recv(held_by_a))

    assert message == {"text": "across", "from_pid": daphne_b.pid, "pid": daphne_a.pid}


async def _recv(websocket: object) -> str:
    import asyncio

    return await asyncio.wait_for(websocket.recv(), timeout=30)  # type: ignore[attr-defined]
