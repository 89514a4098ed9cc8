"""What the agent's disk guard costs: one pass over 8 running rentals (issue 33 item 1).

    python -m bench.disk_guard                  # 8 rentals of 10,000 files and 800 MiB each

Starts ``--rentals`` real containers (the busybox test image, through the agent's own
ContainerRuntime), has each write ``--files`` small files and a ``--mib`` MiB file into its
writable layer, then times ``--passes`` passes of ``DiskGuard.check`` (what the agent runs
every 10 s, and sooner while the disk falls fast): wall seconds and this process's CPU
seconds per pass (the median), and the CPU share at one pass per 10 s; then the CPU of the
guard's tick between passes (free space, the rentals' write counters), four a second. Needs
root and Docker.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid
from typing import Any

from bench import common


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rentals", type=int, default=8)
    parser.add_argument("--files", type=int, default=10_000, help="small files per rental")
    parser.add_argument("--mib", type=int, default=800, help="one big file per rental, MiB")
    parser.add_argument("--passes", type=int, default=15)
    args = parser.parse_args()

    import docker

    from supplier_agent.containers import LABEL_CLAIM, LABEL_LEASE, ContainerRuntime
    from supplier_agent.disk_guard import INTERVAL_S, TICK_S, DiskGuard
    from supplier_agent.protocol import DockerRun

    client = docker.from_env(timeout=60)
    image = common.build_busybox_image()
    agent_id = str(uuid.uuid4())
    runtime = ContainerRuntime(client, gpu_devices="none", stop_grace_s=1, allow_local_images=True)
    fill = (
        f"i=0; while [ $i -lt {args.files} ]; do echo $i > /f$((i % 100))_$i; i=$((i+1)); done; "
        f"dd if=/dev/zero of=/big bs=1M count={args.mib} 2>/dev/null; touch /ready; exec sleep 3600"
    )
    try:
        for _ in range(args.rentals):
            spec = DockerRun(
                command_id=str(uuid.uuid4()),
                lease_id=str(uuid.uuid4()),
                epoch=1,
                image=image,
                command=("sh", "-c", fill),
            )
            runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=60)
        containers = client.containers.list(filters={"label": f"{LABEL_CLAIM}={agent_id}"})
        deadline = time.monotonic() + 600
        while not all(c.exec_run(["test", "-e", "/ready"]).exit_code == 0 for c in containers):
            if time.monotonic() > deadline:
                raise SystemExit("the rentals did not finish writing in 10 minutes")
            time.sleep(1)
        guard = DiskGuard(
            client,
            str(client.info()["DockerRootDir"]),
            claim_label=LABEL_CLAIM,
            lease_label=LABEL_LEASE,
            agent_id=agent_id,
            floor_bytes=0,
            stop_container=runtime.stop_for_disk,
        )
        events: list[Any] = []
        guard.check(lambda *event: events.append(event))  # the first pass inspects each once
        walls, cpus = [], []
        for _ in range(args.passes):
            wall, cpu = time.perf_counter(), time.process_time()
            guard.check(lambda *event: events.append(event))
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        tick_cpus = []
        for _ in range(40):  # what the guard does 4 times a second between passes
            cpu = time.process_time()
            guard.free_bytes()
            guard._writing()  # the tick's own work, measured alone
            tick_cpus.append(time.process_time() - cpu)
        used = sorted(r.used for r in guard.rentals.values())
        files = sorted(r.files for r in guard.rentals.values())
    finally:
        for container in client.containers.list(
            all=True, filters={"label": f"{LABEL_CLAIM}={agent_id}"}
        ):
            # A test run's own clean-up may be removing it already (the same test image).
            with contextlib.suppress(docker.errors.APIError):
                container.remove(force=True, v=True)
        client.close()
    result = {
        "benchmark": "disk_guard",
        "machine": common.machine(),
        "rentals": args.rentals,
        "files_per_rental": files[0] if files else 0,
        "mib_per_rental": round(used[0] / 1024**2) if used else 0,
        "passes": args.passes,
        "pass_wall_s_median": round(statistics.median(walls), 4),
        "pass_wall_s_max": round(max(walls), 4),
        "pass_cpu_s_median": round(statistics.median(cpus), 4),
        "cpu_share_at_one_pass_per_interval": round(statistics.median(cpus) / INTERVAL_S, 4),
        "tick_cpu_s_median": round(statistics.median(tick_cpus), 5),
        "cpu_share_of_ticks": round(statistics.median(tick_cpus) / TICK_S, 4),
        "stops": len([e for e in events if e[1]]),
    }
    path = common.write_result("disk-guard", result)
    print(result)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
