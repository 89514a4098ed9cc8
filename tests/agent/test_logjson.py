"""LOG_FORMAT=json: one JSON object per line, with ids as fields and tokens redacted, for the
agent (supplier_agent/logjson.py) and the hub's processes (hub/lib/logjson.py)."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

from hub.lib.logjson import HubJsonFormatter
from hub.lib.ports import free_port
from supplier_agent.logjson import JsonFormatter, bind, bound
from tests.support.agents import agent_env, configure, new_token, running_agent
from tests.support.loops import run_on_own_loop
from tests.support.polling import wait_for

TOKEN = "cgpu_" + "A1b2C3d4E5" * 3 + "zZ9yY8"


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("cloudgpu.test", logging.WARNING, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_line_carries_the_ids_given_with_it_and_hides_tokens() -> None:
    line = JsonFormatter().format(
        _record("token %s refused", TOKEN, host_id=7, lease_id="3f0c", command_id="9a1b")
    )
    entry = json.loads(line)
    assert entry["msg"] == "token cgpu_[redacted] refused"
    assert (entry["host_id"], entry["lease_id"], entry["command_id"]) == (7, "3f0c", "9a1b")
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "cloudgpu.test"
    assert TOKEN not in line


def test_bound_ids_belong_to_their_task_only() -> None:
    formatter = JsonFormatter()

    async def socket(host_id: int) -> dict[str, object]:
        bind(host_id=host_id)
        await asyncio.sleep(0)  # the other task runs and binds its own
        return dict(json.loads(formatter.format(_record("heartbeat"))))

    async def both() -> list[dict[str, object]]:
        return list(await asyncio.gather(socket(1), socket(2)))

    first, second = run_on_own_loop(both())
    assert (first["host_id"], second["host_id"]) == (1, 2)
    assert "host_id" not in json.loads(formatter.format(_record("outside")))
    with bound(command_id="c1"):
        assert json.loads(formatter.format(_record("x")))["command_id"] == "c1"
    assert "command_id" not in json.loads(formatter.format(_record("x")))


def test_the_hubs_formatter_uses_the_hubs_full_redaction() -> None:
    line = HubJsonFormatter().format(_record("GET /api/p2p/ws/secret-legacy-token?key=abc"))
    assert "secret-legacy-token" not in line
    assert "key=abc" not in line


def test_the_agent_logs_json_lines_with_its_agent_id(tmp_path: Path) -> None:
    state = tmp_path / "agent"
    token = new_token()
    # Nothing listens there: the agent logs its attempts and keeps trying.
    hub = f"http://127.0.0.1:{free_port()}"
    assert configure(state, hub, token, "--runtime", "mock").returncode == 0
    log = tmp_path / "agent.log"
    with running_agent(state, log, env=agent_env(LOG_FORMAT="json")):
        wait_for(
            lambda: "connection to the hub lost" in log.read_text(),
            timeout_s=60,
            what="a failed connection logged",
        )
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    agent_ids = {e.get("agent_id") for e in entries}
    assert len(agent_ids) == 1
    assert None not in agent_ids
    assert token not in log.read_text()
