"""The hub's own outages, with real processes: a Redis that is killed and comes back costs no
agent its socket; while Postgres is down the API answers 503 in its JSON shape, and the hub
recovers when Postgres is back, without a restart. (make run's restarts of killed children:
tests/hub/test_runner.py; no early offline after a Redis restart: the sweep's hold, in
tests/hub/suppliers/test_supplier_services.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from asgiref.sync import async_to_sync
from django.conf import settings
from websockets.sync.client import connect as ws_connect

from hub.lib.channel_layer import ResilientRedisChannelLayer
from hub.lib.embedded import EmbeddedPostgres
from hub.lib.ports import free_port, wait_for_port
from hub.lib.supervise import Supervisor
from hub.suppliers import services
from hub.suppliers.models import Host, HostTransition
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
    _, token = services.create_agent_token(
        make_user("supplier"), "test", default_price_per_hour_micros=0
    )
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
        layer = ResilientRedisChannelLayer(hosts=[redis_url], prefix=settings.REDIS_KEY_PREFIX)
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


class _Beats(threading.Thread):
    """An agent's heartbeats on its socket every half second while ``on`` is set."""

    def __init__(self, ws: Any) -> None:
        super().__init__(daemon=True)
        self.ws, self.on, self.done = ws, threading.Event(), threading.Event()
        self.last_sent = 0.0

    def run(self) -> None:
        while not self.done.is_set():
            if self.on.is_set():
                self.ws.send(_heartbeat_frame(50))
                self.last_sent = time.time()
            self.done.wait(0.5)


def test_a_redis_restart_from_an_old_snapshot_marks_no_host_offline_early(tmp_path: Path) -> None:
    supplier = make_user("supplier")
    redis_port = free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    offline_after_s = 8
    with ExitStack() as stack:
        first_redis = stack.enter_context(own_redis(redis_port, tmp_path / "r1.log", snapshots))
        hub = stack.enter_context(
            hub_stack.hub_stack(
                tmp_path, redis_url=redis_url, HOST_OFFLINE_AFTER_S=str(offline_after_s)
            )
        )
        token = hub.manage(
            "hub", "token", "create", "--owner", supplier.username, "--default-price", "0"
        )
        ws = stack.enter_context(
            ws_connect(
                f"ws://127.0.0.1:{hub.web_ports[0]}/api/p2p/ws/",
                additional_headers={"Authorization": f"Bearer {token}"},
            )
        )
        agent_id = str(uuid.uuid4())
        ws.send(encode(register_message(agent_id)))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        host = Host.objects.get(agent_id=agent_id)
        beats = _Beats(ws)
        beats.on.set()
        beats.start()
        stack.callback(beats.done.set)
        redis_client = redis.Redis.from_url(redis_url)
        stack.callback(redis_client.close)

        def deadline() -> float:
            key = f"{settings.REDIS_KEY_PREFIX}:host-liveness"
            return float(redis_client.zscore(key, str(host.pk)) or 0)

        snapshot_deadline = wait_for(deadline, timeout_s=30, what="a liveness deadline")
        redis_client.save()
        # Heartbeats go on until the snapshot is well out of date.
        wait_for(
            lambda: deadline() > snapshot_deadline + offline_after_s + 2,
            timeout_s=60,
            what="the live deadline to move past the snapshot's",
        )
        beats.on.clear()
        last_beat = beats.last_sent
        first_redis.kill()
        first_redis.wait()
        stack.enter_context(own_redis(redis_port, tmp_path / "r2.log", snapshots))
        # Redis is back with deadlines from the snapshot, all past. The host's real deadline
        # (its last heartbeat + 8 s) is still ahead: any offline now would be early.
        assert (
            wait_for(lambda: deadline() or None, timeout_s=30, what="the snapshot loaded")
            < time.time()
        )
        wait_for(
            lambda: time.time() >= last_beat + offline_after_s - 2,
            timeout_s=30,
            what="the sweeps to run on the stale snapshot",
        )
        assert not HostTransition.objects.filter(host=host, to_status="offline").exists()
        beats.on.set()  # the agent goes on; it never was away

        # And the sweep does work after the restart: silence takes the host offline, on time.
        wait_for(lambda: deadline() > time.time() + 4, timeout_s=30, what="fresh heartbeats")
        beats.on.clear()
        last_beat = beats.last_sent
        went = wait_for(
            lambda: HostTransition.objects.filter(host=host, to_status="offline").first(),
            timeout_s=60,
            what="the silent host offline",
        )
        assert went.at.timestamp() >= last_beat + offline_after_s
