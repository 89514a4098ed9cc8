"""Every figure of docs/benchmarks.md, one after the other: ``python -m bench [--quick]``.

Each script starts the hub processes it needs on a scratch database and writes its JSON to
bench/results/; run them one at a time (they share the machine's cores). `make bench` runs
this under ``hub.runner exec`` (embedded Postgres and Redis unless DATABASE_URL/REDIS_URL are
set).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from bench.common import REPO


def figures(quick: bool, agents: int) -> list[list[str]]:
    hold = "120" if quick else "600"
    return [
        ["bench.agent_footprint", "--seconds", "60" if quick else "120"],
        ["bench.dispatch", "mock", "--leases", "10" if quick else "30"],
        ["bench.dispatch", "docker", "--leases", "5" if quick else "10"],
        ["bench.heartbeats", "ramp", *(["--steps", "100,200,400"] if quick else [])],
        # Registration runs at 20-40 agents/s on one 2-core machine: give 10,000 time to connect.
        [
            "bench.heartbeats",
            "held",
            "--agents",
            str(agents),
            "--hold",
            hold,
            "--connect-timeout",
            str(max(600, agents // 8)),
        ],
        [
            "bench.reconnect",
            "--agents",
            str(agents),
            "--repeats",
            "1" if quick else "2",
            "--timeout",
            str(max(600, agents // 8)),
        ],
        ["bench.web_load", "--seconds", "30" if quick else "120"],
        ["bench.protocol_parse", "--rounds", "3" if quick else "7"],
        ["bench.offers_scale", "--hosts", "2000" if quick else "10000"],
        # Needs root, openssh-server and nginx (it runs the real gateway); says so otherwise.
        ["bench.tunnel", *(["--requests", "300", "--rounds", "1"] if quick else [])],
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer repeats")
    parser.add_argument("--agents", type=int, default=1000, help="agents held (goal: 10,000)")
    args = parser.parse_args()
    failed = []
    for figure in figures(args.quick, args.agents):
        print(f"\n=== python -m {' '.join(figure)}", flush=True)
        if subprocess.run([sys.executable, "-m", *figure], cwd=REPO, check=False).returncode:
            failed.append(figure[0])
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
