"""What one heartbeat group-commit write costs the web process in CPU (issue 15).

    python -m bench.group_commit_cost                  # 7 rounds of 2 s per variant

At 10,000 agents held a web process writes ~600 small pipelines a second to Redis (one per
heartbeat, or per few: hub.agents.heartbeat_batch), so their Python cost is a share of a core.
Three variants, each a one-host write (ZADD of the liveness deadline, plus an HSET of pending
telemetry on every fourth write) on the channel layer's own pool against the real Redis:

``redis_py_pipeline``
    redis-py's ``Pipeline`` (what the group commit used up to this change): the baseline.
``send_pipeline``
    ``hub.lib.redis_pipeline.send``: the same commands packed and sent on a pool
    connection, each reply read, without Pipeline's command stack, retry and callbacks.
``record``
    ``heartbeat_batch.record``, the whole group-commit path of one heartbeat.

Each figure is CPU microseconds of this process per write (``time.process_time``, so Redis's
own work is not in it) and writes/s of wall time, the median of ``--rounds`` windows, rounds
interleaved so that a noisy neighbour slows every variant alike.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench import common


async def _measure(call: Callable[[int], Awaitable[object]], seconds: float) -> tuple[float, float]:
    n = 0
    wall, cpu = time.perf_counter(), time.process_time()
    until = wall + seconds
    while time.perf_counter() < until:
        for _ in range(100):
            await call(n)
            n += 1
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return cpu / n * 1e6, n / wall


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    from channels.layers import get_channel_layer

    from hub.agents import heartbeat_batch
    from hub.lib import redis_pipeline
    from hub.lib.compat_channels_redis import layer_redis
    from hub.suppliers import liveness

    client = layer_redis(get_channel_layer())
    pool = client.connection_pool
    live, pending = liveness.liveness_key(), heartbeat_batch.pending_key()
    entry = heartbeat_batch.pending_entry('{"type":"heartbeat","v":1}', time.time())

    async def redis_py_pipeline(n: int) -> object:
        async with client.pipeline(transaction=False) as pipe:
            pipe.zadd(live, {str(n % 10_000): time.time() + 45})
            if n % 4 == 0:
                pipe.hset(pending, mapping={str(n % 10_000): entry})
            return await pipe.execute()

    async def send_pipeline(n: int) -> object:
        commands: list[redis_pipeline.Command] = [("ZADD", live, time.time() + 45, str(n % 10_000))]
        if n % 4 == 0:
            commands.append(("HSET", pending, str(n % 10_000), entry))
        return await redis_pipeline.send(pool, commands)

    async def record(n: int) -> object:
        return await heartbeat_batch.record(
            n % 10_000, time.time() + 45, entry if n % 4 == 0 else None
        )

    calls = {
        "redis_py_pipeline": redis_py_pipeline,
        "send_pipeline": send_pipeline,
        "record": record,
    }
    samples: dict[str, list[tuple[float, float]]] = {label: [] for label in calls}
    for call in calls.values():  # warm: connections made, code paths run once
        await _measure(call, 0.2)
    gc.collect()
    gc.disable()
    try:
        for _ in range(args.rounds):
            for label, call in calls.items():
                samples[label].append(await _measure(call, args.window))
                gc.collect()
    finally:
        gc.enable()
        await client.delete(live, pending)
    return {
        label: {
            "cpu_us_per_write": round(statistics.median(s[0] for s in values), 1),
            "writes_per_s": round(statistics.median(s[1] for s in values)),
            "cpu_us_min_max": [
                round(min(s[0] for s in values), 1),
                round(max(s[0] for s in values), 1),
            ],
        }
        for label, values in samples.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--name", default="group-commit-cost")
    args = parser.parse_args()
    env = common.bench_env()
    common.setup_django(env)
    result: dict[str, Any] = {
        "figure": "heartbeat group-commit write, CPU per write",
        "machine": common.machine(),
        "rounds": args.rounds,
        "window_s": args.window,
        "per_write": asyncio.run(_run(args)),
    }
    common.write_result(args.name, result)


if __name__ == "__main__":
    main()
