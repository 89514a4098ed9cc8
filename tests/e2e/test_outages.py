"""The hub's own outages, with real processes: a Redis that is killed and comes back costs no
agent its socket; while Postgres is down the API answers 503 in its JSON shape, and the hub
recovers when Postgres is back, without a restart. (make run's restarts of killed children:
tests/hub/test_runner.py; no early offline after a Redis restart: the sweep's hold, in
tests/hub/suppliers/test_supplier_services.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
from asgiref.sync import async_to_sync
from websockets.sync.client import connect as ws_connect

from hub.lib.channel_layer import ResilientRedisChannelLayer
from hub.lib.embedded import EmbeddedPostgres
from hub.lib.ports import free_port, wait_for_port
from hub.lib.supervise import Supervisor
from hub.suppliers import services
from hub.suppliers.models import Host
from supplier_agent.protocol import Ping, encode
from tests.hub.factories import gpu_state, heartbeat, make_user, register_message
from tests.support import hub_stack
from tests.support.polling import wait_for
from tests.support.processes import REPO_ROOT, hub_env, python_module, running
from tests.support.redis_server import own_redis

pytestmark = pytest.mark.django_db(transaction=True)


def _heartbeat_frame(utilization: int) -> str:
    return encode(heartbeat([gpu_state(0, utilization_pct=utilization)]))


def test_agent_sockets_survive_a_redis_outage_and_hear_the_hub_after_it(tmp_path: Path) -> None:
    _, token = services.create_agent_token(make_user("supplier"), "test")
    redis_port, web_port = free_port(), free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    env = hub_env(
        DATABASE_URL=hub_stack.test_database_url(),
        REDIS_URL=redis_url,
        DEBUG="1",
        AGENT_HEARTBEAT_INTERVAL_S="1",
    )
    web_argv = python_module(
        "hub.serve", "-b", "127.0.0.1", "-p", str(web_port), "hub.asgi:application"
    )
    agent_id = str(uuid.uuid4())
    with ExitStack() as stack:
        first_redis = stack.enter_context(own_redis(redis_port, tmp_path / "redis-1.log"))
        stack.enter_context(running(web_argv, env=env, log=tmp_path / "web.log"))
        assert wait_for_port(web_port, timeout_s=60)
        ws = stack.enter_context(
            ws_connect(
                f"ws://127.0.0.1:{web_port}/api/p2p/ws/",
                additional_headers={"Authorization": f"Bearer {token}"},
            )
        )
        ws.send(encode(register_message(agent_id)))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        host = Host.objects.get(agent_id=agent_id)

        first_redis.kill()  # kill -9: the channel layer, the liveness set and Celery's broker
        first_redis.wait()
        seen_before = host.last_seen_at
        for utilization in (10, 60, 90):
            ws.send(_heartbeat_frame(utilization))
        # The socket is still up, and its heartbeats reached Postgres instead.
        assert ws.ping().wait(10)
        wait_for(
            lambda: Host.objects.get(pk=host.pk).last_seen_at != seen_before,
            timeout_s=30,
            what="a heartbeat written to Postgres during the outage",
        )

        stack.enter_context(own_redis(redis_port, tmp_path / "redis-2.log"))
        # The hub reaches the same socket through the channel layer again.
        layer = ResilientRedisChannelLayer(hosts=[redis_url], prefix="cloudgpu")
        nonce = uuid.uuid4().hex
        frame = encode(Ping(nonce=nonce))
        async_to_sync(layer.send)(host.channel_name, {"type": "agent.command", "frame": frame})
        assert json.loads(ws.recv(timeout=30)) == json.loads(frame)
        ws.send(_heartbeat_frame(20))
        assert ws.ping().wait(10)
    log = (tmp_path / "web.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def _manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def test_while_postgres_is_down_the_api_says_503_and_the_hub_recovers_by_itself(
    state_dir: Path,
) -> None:
    # A Postgres of this test's own, to stop and start again (same data, same port).
    first = Supervisor()
    database_url = EmbeddedPostgres(state_dir / "postgres").start(first)
    second: Supervisor | None = None
    try:
        env = hub_env(
            DATABASE_URL=database_url,
            DEBUG="0",
            SECRET_KEY="s" * 50,
            DATABASE_POOL_TIMEOUT_S="2",
        )
        _manage(env, "migrate", "--noinput", "-v", "0")
        token = _manage(
            env,
            "shell",
            "-c",
            "from hub.accounts.models import User; "
            "from hub.accounts.api_tokens import create_api_token; "
            "print(create_api_token(User.objects.create_user('outage-renter'), 't')[1])",
        )
        port = free_port()
        argv = python_module(
            "hub.serve", "-b", "127.0.0.1", "-p", str(port), "hub.asgi:application"
        )
        auth = {"Authorization": f"Bearer {token}"}
        account = f"http://127.0.0.1:{port}/api/v1/account/"
        with running(argv, env=env, log=state_dir / "web.log"):
            assert wait_for_port(port, timeout_s=60)
            assert httpx.get(account, headers=auth, timeout=30).status_code == 200

            first.stop_all()  # Postgres goes away under a hub with pooled connections
            down = httpx.get(account, headers=auth, timeout=30)
            assert down.status_code == 503
            assert down.headers["content-type"] == "application/json"
            assert "briefly unavailable" in down.json()["detail"]
            assert int(down.headers["retry-after"]) > 0

            second = Supervisor()
            assert EmbeddedPostgres(state_dir / "postgres").start(second) == database_url
            # Broken pooled connections are replaced, not reused: no restart of the hub.
            wait_for(
                lambda: httpx.get(account, headers=auth, timeout=30).status_code == 200,
                timeout_s=60,
                what="the API back after Postgres",
            )
    finally:
        first.stop_all()
        if second is not None:
            second.stop_all()
