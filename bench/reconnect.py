"""Reconnect storm (issue 8): the hub's web process restarts with N agents connected.

    python -m bench.reconnect --agents 1000 --repeats 3

The agents (bench/swarm.py) reconnect as the real agent does (full-jitter backoff from 1 s,
capped at 60 s), ungated. Figures per restart: seconds from stopping Daphne until every agent
is registered again (goal <= 60 s at 10,000), and from the new Daphne listening; Redis client
connections of the hub at steady state and after the storm (goal <= 2 x hub processes).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import threading
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

import psutil
import redis

from bench import common
from bench import redis_clients as clients_of
from bench.swarm import Swarm


def redis_clients(url: str, exclude: set[int]) -> int:
    """Client connections to the hub's Redis database (this script's own left out)."""
    db = int((urlsplit(url).path or "/0").lstrip("/") or 0)
    client = redis.Redis.from_url(url)
    try:
        return sum(
            1
            for c in client.client_list()
            if int(c.get("db", -1)) == db and int(c["id"]) not in exclude
        )
    finally:
        client.close()


def redis_clients_by_process(url: str, hub: common.Hub) -> dict[str, int]:
    """Which hub process holds how many Redis connections: Redis' CLIENT LIST matched to the
    processes by address (bench/redis_clients.py, as tests/e2e/test_redis_connections.py)."""
    pids = {name: process.pid for name, process in hub.processes.items()}
    return clients_of.counts(clients_of.clients_by_process(url, pids))


def _merged(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for reason, n in one.items():
            total[reason] = total.get(reason, 0) + n
    return dict(sorted(total.items(), key=lambda kv: -kv[1])[:8])


def offline_transitions(url: str) -> int:
    """Hosts marked offline so far (the sweep's transition rows): a storm should add none."""
    import psycopg

    with psycopg.connect(**common.pg_conninfo(url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM suppliers_hosttransition WHERE to_status = 'offline'"
        ).fetchone()
    return int(row[0]) if row else 0


def back_curve(back_at: list[float], listening: float, agents: int) -> dict[str, Any]:
    """When the agents came back, from the new web process listening: the time to each share
    of them, and the most registrations in one second (the web process's rate once the
    agents' backoff brings enough of them at once; the tail is their backoff)."""
    times = sorted(t - listening for t in back_at)
    if not times:
        return {}
    per_second: dict[int, int] = {}
    for t in times:
        per_second[int(t)] = per_second.get(int(t), 0) + 1

    def at_share(share: float) -> float:
        return round(times[min(len(times) - 1, math.ceil(share * agents) - 1)], 2)

    return {
        "back_50pct_s": at_share(0.5),
        "back_90pct_s": at_share(0.9),
        "back_99pct_s": at_share(0.99),
        "peak_registrations_per_s": max(per_second.values()),
        "registrations_per_s": [per_second.get(n, 0) for n in range(int(times[-1]) + 1)],
    }


def web_cpu_s(hub: common.Hub) -> float:
    """CPU seconds the web processes have used so far (user and system)."""
    total = 0.0
    for name, process in hub.processes.items():
        if name.startswith("web"):
            with contextlib.suppress(psutil.NoSuchProcess):
                times = psutil.Process(process.pid).cpu_times()
                total += times.user + times.system
    return total


class CpuSampler:
    """The web processes' CPU seconds over time (every 0.2 s, in a thread), to read what they
    had used at a given moment."""

    def __init__(self, hub: common.Hub) -> None:
        self.hub = hub
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), web_cpu_s(self.hub)))
            self._stop.wait(0.2)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, moment: float) -> float:
        """CPU seconds used by ``moment`` (the last sample at or before it)."""
        before = [cpu for t, cpu in self.samples if t <= moment]
        return before[-1] if before else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--webs", type=int, default=1, help="web (Daphne) processes")
    parser.add_argument("--name", default="", help="suffix of the result file")
    parser.add_argument(
        "--tokens",
        choices=("shared", "per-host"),
        default="shared",
        help="shared: one supplier's token for every agent (its check is cached per process);"
        " per-host: a supplier and token for each agent, a fleet of one-host suppliers",
    )
    args = parser.parse_args()
    env = common.bench_env()
    common.prepare(env)
    token = common.create_user_and_token(env, "bench-supplier")
    token_file = None
    if args.tokens == "per-host":
        token_file = common.create_one_host_suppliers(env, args.agents, common.LOG_DIR)
    result: dict[str, Any] = {"figure": "reconnect storm", "machine": common.machine()}
    result["baselines"] = {
        "B_pg1_updates_per_s": round(common.baseline_pg1(env["DATABASE_URL"])),
        "B_rtt_ms": common.ms(common.baseline_rtt(env["REDIS_URL"])),
    }
    own = redis.Redis.from_url(env["REDIS_URL"])
    exclude = {int(own.client_id())}
    restarts = []
    hub_processes = common.Hub(env, webs=args.webs)
    with (
        hub_processes.start() as hub,
        Swarm(hub.ws_url, token, args.agents, token_file=token_file) as swarm,
    ):
        connected = swarm.wait_connected(args.timeout)
        result["initial_connect"] = connected
        cpu_before_settle = web_cpu_s(hub)
        time.sleep(20)  # one heartbeat round, sweeps and the worker's pool settle
        # The web process's CPU with every agent connected (their heartbeats): the part of a
        # storm's CPU that is not registration.
        result["web_cpu_steady_pct"] = round(100 * (web_cpu_s(hub) - cpu_before_settle) / 20, 1)
        steady = redis_clients(env["REDIS_URL"], exclude)
        result["redis_connections_steady"] = steady
        result["hub_processes"] = hub.process_count()
        result["redis_connections_by_process"] = redis_clients_by_process(env["REDIS_URL"], hub)
        for _ in range(args.repeats):
            offline_before = offline_transitions(env["DATABASE_URL"])
            swarm.storm()
            stopped = time.time()
            hub.stop_web()
            hub.start_web()
            listening = time.time()
            cpu_at_listening = web_cpu_s(hub)  # its start-up left out
            with CpuSampler(hub) as sampler:
                back = swarm.wait_all_back(args.timeout)
            cpu_storm = web_cpu_s(hub) - cpu_at_listening
            if len(back) < len(swarm.processes):
                status = swarm.status()
                restarts.append({"timed_out": True, "connected": status["connected"]})
                break
            last = max(message["at"] for message in back.values())
            curve = back_curve(
                [t for m in back.values() for t in m.get("back_at", [])], listening, args.agents
            )
            # To 99 % back: the tail after it is the agents' backoff, with the web process
            # mostly serving heartbeats.
            cpu_99 = sampler.at(listening + curve.get("back_99pct_s", 0)) - cpu_at_listening
            restarts.append({
                "all_back_s": round(last - stopped, 1),
                "all_back_after_listening_s": round(last - listening, 1),
                "daphne_restart_s": round(listening - stopped, 1),
                **curve,
                # The web process's CPU from listening to all back, and to 99 % back, per
                # registration: what a registration costs (with the heartbeats of the agents
                # already back), whatever share of the machine it got.
                "web_cpu_s": round(cpu_storm, 2),
                "web_cpu_ms_per_registration": round(1000 * cpu_storm / args.agents, 2),
                "web_cpu_to_99pct_s": round(cpu_99, 2),
                "web_cpu_ms_per_registration_to_99pct": round(
                    1000 * cpu_99 / (0.99 * args.agents), 2
                ),
                "failed_connect_attempts": sum(m["failed"] for m in back.values()),
                "failure_reasons": _merged(m.get("failure_reasons", {}) for m in back.values()),
                "redis_connections_after": redis_clients(env["REDIS_URL"], exclude),
            })  # fmt: skip
            time.sleep(20)
            restarts[-1]["hosts_marked_offline"] = (
                offline_transitions(env["DATABASE_URL"]) - offline_before
            )
            print(f"[reconnect] {restarts[-1]}", flush=True)
    own.close()
    if token_file is not None:
        token_file.unlink()
    done = [r["all_back_s"] for r in restarts if "all_back_s" in r]
    result.update(
        agents=args.agents,
        web_processes=args.webs,
        tokens=args.tokens,
        restarts=restarts,
        all_back_s_median=common.median(done) if done else None,
        all_back_s_max=max(done) if done else None,
        agents_per_s_median=round(args.agents / common.median(done), 1) if done else None,
    )
    suffix = f"-{args.name}" if args.name else ""
    common.write_result(f"reconnect-{args.agents}{suffix}", result)


if __name__ == "__main__":
    main()
