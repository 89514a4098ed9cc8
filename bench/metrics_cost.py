"""What the hub's metrics cost a heartbeat, in isolation (issue 19): the two updates
``hub.agents.heartbeats.arrived`` makes per heartbeat (a counter and a histogram), timed in
prometheus_client's multiprocess mode (memory-mapped files, as ``make run`` sets it) and in
its single-process mode, next to an empty loop in the same run.

    python -m bench.metrics_cost [--iterations 200000]

No hub, no services: the figure is CPU time per heartbeat in this process.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench import common


def _measure(iterations: int) -> dict[str, float]:
    from hub.lib import metrics

    def per_call_ns(body: Any) -> float:
        best = float("inf")
        for _ in range(5):  # best of five: the machine is shared
            started = time.perf_counter_ns()
            body(iterations)
            best = min(best, (time.perf_counter_ns() - started) / iterations)
        return best

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def heartbeat_updates(n: int) -> None:
        for _ in range(n):
            metrics.HEARTBEATS.inc()
            metrics.HEARTBEAT_SECONDS.observe(0.003)

    loop = per_call_ns(empty)
    return {
        "empty_loop_ns": round(loop, 1),
        "per_heartbeat_ns": round(per_call_ns(heartbeat_updates) - loop, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=200_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(_measure(args.iterations))
        return
    result: dict[str, Any] = {"figure": "metrics cost per heartbeat", "machine": common.machine()}
    for mode in ("single_process", "multiprocess"):
        env = dict(os.environ)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        with tempfile.TemporaryDirectory() as folder:
            if mode == "multiprocess":
                env["PROMETHEUS_MULTIPROC_DIR"] = folder
            out = subprocess.run(
                [sys.executable, "-m", "bench.metrics_cost", "--child", "--iterations",
                 str(args.iterations)],
                env=env, capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
        result[mode] = ast.literal_eval(out.strip().splitlines()[-1])
        print(f"[{mode}] {result[mode]}", flush=True)
    common.write_result("metrics-cost", result)


if __name__ == "__main__":
    main()
