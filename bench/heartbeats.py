"""How the hub takes agents' heartbeats: N simulated agents (real protocol, many per process)
against one Daphne, with the raw baselines measured in the same run.

    DATABASE_URL=postgres://... REDIS_URL=redis://... python -m bench.heartbeats --agents 1000

The database named in DATABASE_URL is used as is (migrated first): point it at a scratch one.
Figures: heartbeat-to-processed latency (a heartbeat followed by a probe frame whose error reply
comes back only after the heartbeat was handled: an upper bound), Postgres row updates and
commits per heartbeat, Daphne RSS per idle connection; baselines B_pg1 (single-row UPDATE/s,
one client) and B_rtt (Redis PING round trip).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import psycopg
import redis
from websockets.asyncio.client import connect

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hub.lib.env import database_from_url  # noqa: E402
from hub.lib.ports import free_port, wait_for_port  # noqa: E402


def _pg_conninfo(url: str) -> dict[str, object]:
    db = database_from_url(url)
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": int(db["PORT"] or 5432),
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
        "dbname": db["NAME"],
    }


def baseline_pg1(url: str, seconds: float = 3.0) -> float:
    with psycopg.connect(**_pg_conninfo(url), autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE b (id int primary key, n bigint)")
        conn.execute("INSERT INTO b VALUES (1, 0)")
        done, deadline = 0, time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            conn.execute("UPDATE b SET n = n + 1 WHERE id = 1")
            done += 1
    return done / seconds


def baseline_rtt(url: str, count: int = 2000) -> float:
    client = redis.Redis.from_url(url)
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - start)
    client.close()
    return statistics.median(samples)


def pg_counters(url: str) -> tuple[int, int]:
    with psycopg.connect(**_pg_conninfo(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT tup_updated + tup_inserted, xact_commit FROM pg_stat_database "
            "WHERE datname = current_database()"
        ).fetchone()
    return int(row[0]), int(row[1])


def manage(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True,
        text=True, check=True,
    ).stdout.strip()  # fmt: skip


def register_frame(agent_id: str) -> str:
    gpu = {
        "index": 0, "uuid": f"GPU-{uuid.UUID(agent_id)}", "name": "NVIDIA GeForce RTX 4090",
        "memory_total_bytes": 24 * 2**30, "memory_used_bytes": 0, "utilization_pct": 0,
        "processes": [],
    }  # fmt: skip
    return json.dumps({
        "type": "register", "v": 1, "agent_id": agent_id, "hostname": f"bench-{agent_id[:8]}",
        "os": "bench", "arch": "x86_64", "cpu_model": "bench", "cpu_count": 1, "ram_bytes": 0,
        "agent_version": "0.1.0", "runtime": "mock", "gpus": [gpu], "claims": [],
    })  # fmt: skip


HEARTBEAT = json.dumps({"type": "heartbeat", "v": 1, "gpus": [], "claims": []})
PROBE = json.dumps({"type": "probe", "v": 1})  # an unknown type: answered with an error


async def agent(
    url: str,
    token: str,
    interval: float,
    until: float,
    out: list[float],
    ready: asyncio.Event,
    counter: list[int],
) -> None:
    async with connect(
        url,
        additional_headers={"Authorization": f"Bearer {token}"},
        compression=None,
        max_size=2**16,
    ) as ws:
        await ws.send(register_frame(str(uuid.uuid4())))
        json.loads(await ws.recv())  # welcome
        counter[0] += 1
        if counter[0] == counter[1]:
            ready.set()
        await ready.wait()
        # Spread the agents over the interval, as real ones are.
        await asyncio.sleep(interval * (hash(ws.id) % 1000) / 1000)
        while time.monotonic() < until:
            start = time.perf_counter()
            await ws.send(HEARTBEAT)
            await ws.send(PROBE)
            await ws.recv()
            out.append(time.perf_counter() - start)
            await asyncio.sleep(max(0.0, interval - (time.perf_counter() - start)))


async def drive(
    url: str, token: str, agents: int, interval: float, seconds: float, measure: object
) -> tuple[list[float], float, object, object]:
    """Connect every agent, let one full interval of first heartbeats pass (each writes its
    stats once), then measure a steady window between two snapshots."""
    latencies: list[float] = []
    ready = asyncio.Event()
    counter = [0, agents]
    until = time.monotonic() + 3600
    tasks = [
        asyncio.create_task(agent(url, token, interval, until, latencies, ready, counter))
        for _ in range(agents)
    ]
    connect_started = time.perf_counter()
    await asyncio.wait_for(ready.wait(), timeout=600)
    connected_in = time.perf_counter() - connect_started
    await asyncio.sleep(interval * 2 + 1)
    before = measure()  # type: ignore[operator]
    latencies.clear()
    await asyncio.sleep(seconds)
    result = list(latencies)
    after = measure()  # type: ignore[operator]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return result, connected_in, before, after


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--interval", type=float, default=1.0, help="heartbeat interval (s)")
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    env = dict(os.environ, DEBUG="1", PYTHONUNBUFFERED="1", LOG_LEVEL="WARNING")
    db_url, redis_url = env["DATABASE_URL"], env["REDIS_URL"]
    manage(env, "migrate", "--noinput", "-v", "0")
    supplier = f"bench-{uuid.uuid4().hex[:6]}"
    manage(
        env,
        "shell",
        "-c",
        f"from hub.accounts.models import User; User.objects.create_user('{supplier}')",
    )
    token = manage(env, "hub", "token", "create", "--owner", supplier)

    b_pg1 = baseline_pg1(db_url)
    b_rtt = baseline_rtt(redis_url)
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "hub.serve", "-v", "0", "-b", "127.0.0.1", "-p", str(port), "hub.asgi:application"],  # noqa: E501
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_for_port(port, timeout_s=60)
        rss_idle = psutil.Process(web.pid).memory_info().rss

        def measure() -> tuple[tuple[int, int], int]:
            return pg_counters(db_url), psutil.Process(web.pid).memory_info().rss

        latencies, connected_in, (before, _), (after, rss_loaded) = asyncio.run(
            drive(
                f"ws://127.0.0.1:{port}/api/p2p/ws/",
                token,
                args.agents,
                args.interval,
                args.seconds,
                measure,
            )
        )
    finally:
        web.terminate()
        web.wait()
    latencies.sort()
    beats = len(latencies)
    p50 = latencies[beats // 2] * 1000
    p99 = latencies[int(beats * 0.99)] * 1000
    report = {
        "agents": args.agents, "interval_s": args.interval, "seconds": args.seconds,
        "connect_all_s": round(connected_in, 2),
        "heartbeats": beats, "heartbeats_per_s": round(beats / args.seconds, 1),
        "latency_p50_ms": round(p50, 2), "latency_p99_ms": round(p99, 2),
        "pg_rows_written_per_heartbeat": round((after[0] - before[0]) / max(beats, 1), 3),
        "pg_commits_per_heartbeat": round((after[1] - before[1]) / max(beats, 1), 3),
        "daphne_rss_per_connection_kib": round((rss_loaded - rss_idle) / args.agents / 1024, 1),
        "B_pg1_updates_per_s": round(b_pg1), "B_rtt_ms": round(b_rtt * 1000, 3),
        "heartbeats_per_s_over_B_pg1": round(beats / args.seconds / b_pg1, 3),
    }  # fmt: skip
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
