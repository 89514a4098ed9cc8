"""Agents held by one hub host, and what their heartbeats cost (issue 8).

    python -m bench.heartbeats held --agents 10000 --hold 600    # real timings (15 s)
    python -m bench.heartbeats ramp --steps 250,500,1000,2000    # interval 1 s, all timings / 15

The hub is one Daphne, one Celery worker and beat on a scratch database (see bench/common.py).
The agents are bench/swarm.py processes (real protocol, a few thousand per process).

``held``: N agents at the production timings; heartbeat-to-processed latency per window (p50,
p99), dropped connections, Daphne RSS per connection, Postgres cost per heartbeat over the whole
hold (which must span several HOST_STATS_WRITE_INTERVAL_S for the periodic writes to show).

``ramp``: the time-compressed mode. Agents are added step by step, each beating every second
with every control-plane timing divided by 15, until p99 passes 100 ms; the heartbeats/s there
is compared with B_pg1.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psutil

from bench import common, reconnect
from bench.swarm import Swarm

LATENCY_GOAL_MS = 100.0


def baselines(env: dict[str, str]) -> dict[str, float]:
    return {
        "B_pg1_updates_per_s": round(common.baseline_pg1(env["DATABASE_URL"])),
        "B_pgbatch_rows_per_s": round(common.baseline_pgbatch(env["DATABASE_URL"])),
        "B_rtt_ms": round(common.baseline_rtt(env["REDIS_URL"]) * 1000, 3),
    }


def pg_cost(delta: dict[str, int], heartbeats: int) -> dict[str, Any]:
    per = max(heartbeats, 1)
    cost: dict[str, Any] = {
        "heartbeats": heartbeats,
        "table_accesses_per_heartbeat": round(delta["table_accesses"] / per, 4),
        "commits_per_heartbeat": round(delta["commits"] / per, 4),
        "rows_updated_per_heartbeat": round(delta["rows_updated"] / per, 4),
        "rows_inserted_per_heartbeat": round(delta["rows_inserted"] / per, 4),
        "hot_update_share": round(delta["hot_updates"] / delta["rows_updated"], 3)
        if delta["rows_updated"]
        else None,
    }
    if "statements" in delta:
        cost["statements_per_heartbeat"] = round(delta["statements"] / per, 4)
        cost["fk_checks_per_heartbeat"] = round(delta.get("fk_checks", 0) / per, 4)
    return cost


def _window_all(swarms: list[Swarm], seconds: float) -> dict[str, Any]:
    for swarm in swarms:
        swarm.send({"cmd": "window", "seconds": seconds})
    latencies: list[float] = []
    drops, cpu = 0, []
    for swarm in swarms:
        for message in swarm.collect("window", seconds + 120).values():
            latencies.extend(message["latencies_ms"])
            drops += message["drops"]
            cpu.append(message["client_cpu_pct"])
    return {"latencies_ms": latencies, "drops": drops, "client_cpu_pct": cpu}


def held(args: argparse.Namespace) -> dict[str, Any]:
    env = common.bench_env(**args.hub_settings)
    common.prepare(env)
    token = common.create_user_and_token(env, "bench-supplier")
    result: dict[str, Any] = {"figure": "agents held", "machine": common.machine()}
    result["hub_settings"] = args.hub_settings
    result["baselines"] = baselines(env)
    with common.Hub(env, webs=args.webs).start() as hub:
        time.sleep(2)
        webs = [psutil.Process(hub.pid(name)) for name in hub.web_names]
        rss_idle = sum(web.memory_info().rss for web in webs)
        with Swarm(hub.ws_url, token, args.agents, interval=args.interval) as swarm:
            connected = swarm.wait_connected(args.connect_timeout)
            result["connect"] = {
                **connected,
                "agents_per_s": round(connected["connected"] / connected["seconds"], 1),
            }
            # Every agent's first heartbeat writes its telemetry once; leave those out.
            time.sleep(args.interval + 2)
            common.pg_flush_stats(env["DATABASE_URL"])
            pg_before = common.pg_snapshot(env["DATABASE_URL"])
            cpu = common.CpuMeter(
                {**{f"daphne-{n}": hub.pid(n) for n in hub.web_names},
                 "worker": hub.pid("worker"), "beat": hub.pid("beat"),
                 **common.server_pids(), **{f"swarm-{i}": p for i, p in enumerate(swarm.pids())}}
            )  # fmt: skip
            windows, all_latencies, drops = [], [], 0
            held_until = time.monotonic() + args.hold
            while time.monotonic() < held_until - 1:
                seconds = min(args.window, held_until - time.monotonic())
                window = swarm.window(seconds)
                all_latencies.extend(window["latencies_ms"])
                drops += window["drops"]
                windows.append({
                    **common.summary(window["latencies_ms"]),
                    "heartbeats_per_s": round(len(window["latencies_ms"]) / window["seconds"], 1),
                    "drops": window["drops"], "connected": window["connected"],
                    "client_cpu_pct": window["client_cpu_pct"],
                })  # fmt: skip
                print(f"[held] {windows[-1]}", flush=True)
            cpu_pct = cpu.percent()
            common.pg_flush_stats(env["DATABASE_URL"])
            pg_after = common.pg_snapshot(env["DATABASE_URL"])
            rss_loaded = sum(web.memory_info().rss for web in webs)
            redis_by_process = reconnect.redis_clients_by_process(env["REDIS_URL"], hub)
            status = swarm.status()
    heartbeats = len(all_latencies)
    result.update(
        agents=args.agents,
        web_processes=args.webs,
        redis_connections_by_process=redis_by_process,
        interval_s=args.interval,
        hold_s=args.hold,
        windows=windows,
        latency_ms={
            "median_of_window_p50": round(common.median([w["p50"] for w in windows]), 2),
            "median_of_window_p99": round(common.median([w["p99"] for w in windows]), 2),
            "worst_window_p99": max(w["p99"] for w in windows),
            **common.summary(all_latencies),
        },
        heartbeats_per_s=round(heartbeats / args.hold, 1),
        dropped_connections=drops,
        connected_at_end=status["connected"],
        daphne_rss_mib=round(rss_loaded / 2**20, 1),
        daphne_rss_per_connection_kib=round(
            (rss_loaded - rss_idle) / max(status["connected"], 1) / 1024, 1
        ),
        cpu_pct_of_one_core=cpu_pct,
        postgres=pg_cost(common.pg_delta(pg_before, pg_after), heartbeats),
    )
    return result


def ramp(args: argparse.Namespace) -> dict[str, Any]:
    env = common.bench_env(**common.COMPRESSED_TIMINGS, **args.hub_settings)
    common.prepare(env)
    token = common.create_user_and_token(env, "bench-supplier")
    result: dict[str, Any] = {"figure": "heartbeat ramp (1 s)", "machine": common.machine()}
    result["hub_settings"] = args.hub_settings
    result["baselines"] = baselines(env)
    b_pg1 = result["baselines"]["B_pg1_updates_per_s"]
    steps: list[dict[str, Any]] = []
    swarms: list[Swarm] = []
    result["web_processes"] = args.webs
    with common.Hub(env, webs=args.webs).start() as hub:
        # One web process keeps the name "daphne" (earlier results); several are named each.
        web_pids = (
            {"daphne": hub.pid("web")}
            if args.webs == 1
            else {f"daphne-{name}": hub.pid(name) for name in hub.web_names}
        )
        try:
            total = 0
            for target in args.steps:
                swarm = Swarm(hub.ws_url, token, target - total, interval=1.0)
                swarms.append(swarm)
                connected = swarm.wait_connected(args.connect_timeout)
                total = target
                time.sleep(args.settle)
                common.pg_flush_stats(env["DATABASE_URL"])
                pg_before = common.pg_snapshot(env["DATABASE_URL"])
                cpu = common.CpuMeter({**web_pids, **common.server_pids()})
                windows = []
                for _ in range(args.repeats):
                    window = _window_all(swarms, args.window)
                    windows.append({
                        **common.summary(window["latencies_ms"]),
                        "heartbeats_per_s": round(len(window["latencies_ms"]) / args.window, 1),
                        "drops": window["drops"], "client_cpu_pct": window["client_cpu_pct"],
                    })  # fmt: skip
                cpu_pct = cpu.percent()
                common.pg_flush_stats(env["DATABASE_URL"])
                pg_after = common.pg_snapshot(env["DATABASE_URL"])
                beats = sum(w["n"] for w in windows)
                step = {
                    "agents": target,
                    "connect": connected,
                    "heartbeats_per_s": round(
                        common.median([w["heartbeats_per_s"] for w in windows]), 1
                    ),
                    "p50_ms": round(common.median([w["p50"] for w in windows]), 2),
                    "p99_ms": round(common.median([w["p99"] for w in windows]), 2),
                    "p99_ms_per_window": [w["p99"] for w in windows],
                    "drops": sum(w["drops"] for w in windows),
                    "cpu_pct_of_one_core": cpu_pct,
                    "client_cpu_pct": windows[-1]["client_cpu_pct"],
                    "postgres": pg_cost(common.pg_delta(pg_before, pg_after), beats),
                }  # fmt: skip
                step["heartbeats_per_s_over_B_pg1"] = round(step["heartbeats_per_s"] / b_pg1, 3)
                steps.append(step)
                print(f"[ramp] {step}", flush=True)
                if step["p99_ms"] > LATENCY_GOAL_MS or connected.get("timed_out"):
                    break
        finally:
            for swarm in swarms:
                swarm.close()
    passing = [s for s in steps if s["p99_ms"] <= LATENCY_GOAL_MS]
    failing = [s for s in steps if s["p99_ms"] > LATENCY_GOAL_MS]
    result.update(
        steps=steps,
        last_rate_within_goal=passing[-1]["heartbeats_per_s"] if passing else None,
        first_rate_past_goal=failing[0]["heartbeats_per_s"] if failing else None,
    )
    if passing:
        result["last_rate_within_goal_over_B_pg1"] = round(
            passing[-1]["heartbeats_per_s"] / b_pg1, 3
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    held_parser = modes.add_parser("held", help="N agents at the production timings")
    held_parser.add_argument("--agents", type=int, default=1000)
    held_parser.add_argument("--interval", type=float, default=15.0)
    held_parser.add_argument("--hold", type=float, default=600.0, help="seconds held")
    held_parser.add_argument("--window", type=float, default=60.0, help="seconds per window")
    held_parser.add_argument("--connect-timeout", type=float, default=600.0)
    ramp_parser = modes.add_parser("ramp", help="interval 1 s: heartbeats/s until p99 > 100 ms")
    ramp_parser.add_argument(
        "--steps",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[25, 50, 100, 200, 400, 800, 1600, 3200],
    )
    ramp_parser.add_argument("--window", type=float, default=10.0)
    ramp_parser.add_argument("--repeats", type=int, default=3)
    ramp_parser.add_argument("--settle", type=float, default=6.0)
    ramp_parser.add_argument("--connect-timeout", type=float, default=300.0)
    for sub in (held_parser, ramp_parser):
        sub.add_argument("--webs", type=int, default=1, help="web (Daphne) processes")
        sub.add_argument(
            "--set",
            dest="hub_settings",
            type=lambda text: dict([text.split("=", 1)]),
            action=_Merge,
            default={},
            metavar="NAME=VALUE",
            help="a hub setting for this run, e.g. DATABASE_POOL_MAX_SIZE=4",
        )
        sub.add_argument("--name", default="", help="suffix of the result file")
    args = parser.parse_args()
    suffix = f"-{args.name}" if args.name else ""
    if args.mode == "held":
        result = held(args)
        common.write_result(f"heartbeats-held-{args.agents}{suffix}", result)
    else:
        result = ramp(args)
        common.write_result(f"heartbeats-ramp{suffix}", result)


class _Merge(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        setattr(namespace, self.dest, {**getattr(namespace, self.dest), **values})


if __name__ == "__main__":
    main()
