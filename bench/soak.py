"""Weeks of uptime in half an hour (issue 23): does anything grow without a bound?

    python -m bench.soak run --minutes 30            # the whole hub and a real Docker agent
    python -m bench.soak agent-leases --leases 20000  # the agent's RSS over many leases

``run``: Daphne, a Celery worker and beat (bench.common.Hub) on a scratch database, and a real
``cloudgpu-agent run`` (Docker runtime, fake NVML with 4 GPUs, ``--gpu-devices none``) running
busybox containers. Two chatty leases print a 64,000-character line once a second (a 64 KiB
burst: the live byte budget); a renter's page follows both over ``/ws/live/`` and is reloaded
every 2 minutes (the backlog is sent again); the renter's API client reads
``/api/v1/leases/{id}/logs/`` once a second; a short lease is rented and released every 30 s.
Every 30 s it samples RSS, open fds and threads of every process (the worker's pool children
counted with it), Redis memory and the run's keys, every table's row count, the agent's state
folder and what Docker keeps of the agent's containers on disk. Growth per hour is the
least-squares slope after the warm-up (the first sixth of the run, at least 5 minutes); for
RSS also the slope of its floor (each 10-minute window's lowest sample), which the 30 s swings
of a few MiB do not move.

``agent-leases``: a real ``cloudgpu-agent run --runtime mock`` against the loopback protocol
peer of the tests, taking each lease through reserve, docker_run and release; its RSS is
sampled every 1,000 leases (goal: at most 40 MB after 20,000).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

import psutil

from bench import common
from bench.dispatch import _people, _start_agent, _wait_online, _wait_state, agent_env

SAMPLE_EVERY_S = 30.0
# RSS floor: the lowest sample of each window of this length (see _floor_slope_per_hour).
FLOOR_BIN_S = 600.0
CHATTY = "while true; do head -c 48000 /dev/urandom | base64 | tr -d '\\n'; echo; sleep 1; done"
SHORT = "echo short lease; exec sleep 3600"
SHORT_EVERY_S = 30.0
SHORT_HELD_S = 10.0
PAGE_RELOAD_S = 120.0


class Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, int] = {}

    def add(self, name: str, amount: int = 1) -> None:
        with self.lock:
            self.values[name] = self.values.get(name, 0) + amount


def _tree(pid: int) -> tuple[int, int, int]:
    """(RSS bytes, open fds, threads) of a process and its children."""
    rss = fds = threads = 0
    try:
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                rss += process.memory_info().rss
                fds += process.num_fds()
                threads += process.num_threads()
            except psutil.NoSuchProcess:
                continue
    except psutil.NoSuchProcess:
        pass
    return rss, fds, threads


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _row_counts(url: str) -> dict[str, int]:
    import psycopg
    from psycopg import sql

    counts = {}
    with psycopg.connect(**common.pg_conninfo(url), autocommit=True) as conn:
        tables = [row[0] for row in conn.execute("SELECT relname FROM pg_stat_user_tables")]
        for table in sorted(tables):
            row = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
            ).fetchone()
            counts[table] = int(row[0]) if row else 0
    return counts


def _docker_logs(client: Any, agent_id: str) -> tuple[int, int]:
    """(bytes under Docker's root of the agent's containers, how many containers)."""
    root = Path(client.info()["DockerRootDir"]) / "containers"
    containers = client.containers.list(all=True, filters={"label": f"cloudgpu.claim={agent_id}"})
    return sum(_folder_bytes(root / c.id) for c in containers), len(containers)


def _sample(
    env: dict[str, str], pids: dict[str, int], state: Path, docker: Any, agent_id: str
) -> dict[str, float]:
    import redis

    sample: dict[str, float] = {"t": time.monotonic()}
    for name, pid in pids.items():
        rss, fds, threads = _tree(pid)
        sample[f"{name}.rss_mib"] = rss / 2**20
        sample[f"{name}.fds"] = fds
        sample[f"{name}.threads"] = threads
    client = redis.Redis.from_url(env["REDIS_URL"])
    sample["redis.used_memory_mib"] = int(client.info("memory")["used_memory"]) / 2**20
    for prefix in ("REDIS_KEY_PREFIX", "CHANNELS_PREFIX"):
        keys = sum(1 for _ in client.scan_iter(match=f"{env[prefix]}*", count=1000))
        sample[f"redis.keys.{prefix.lower()}"] = keys
    client.close()
    for table, count in _row_counts(env["DATABASE_URL"]).items():
        sample[f"rows.{table}"] = count
    sample["agent.state_folder_kib"] = _folder_bytes(state) / 1024
    log_bytes, containers = _docker_logs(docker, agent_id)
    sample["docker.container_folders_mib"] = log_bytes / 2**20
    sample["docker.containers"] = containers
    return sample


def _slope_per_hour(samples: list[dict[str, float]], key: str) -> float:
    points = [(s["t"], s[key]) for s in samples if key in s]
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_v = sum(v for _, v in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return 0.0
    return sum((t - mean_t) * (v - mean_v) for t, v in points) / spread * 3600


def _floor_slope_per_hour(
    samples: list[dict[str, float]], key: str, bin_s: float = FLOOR_BIN_S
) -> float | None:
    """The slope of the lowest value of each ``bin_s`` window: RSS swings by several MiB from
    one 30 s sample to the next (a 3 MB response in flight, the collector's timing), and its
    floor between those swings is what a leak would lift. None with fewer than 3 windows."""
    if not samples:
        return None
    start = samples[0]["t"]
    floors: dict[int, dict[str, float]] = {}
    counts: dict[int, int] = {}
    for sample in samples:
        if key not in sample:
            continue
        index = int((sample["t"] - start) // bin_s)
        counts[index] = counts.get(index, 0) + 1
        if index not in floors or sample[key] < floors[index][key]:
            floors[index] = sample
    # A window cut short by the end of the run has fewer chances to see the floor: left out.
    full = [floors[i] for i in floors if counts[i] * 2 >= max(counts.values())]
    if len(full) < 3:
        return None
    return _slope_per_hour(full, key)


def _page(
    port: int, cookie: str, leases: list[str], stop: threading.Event, counters: Counters
) -> None:
    """A renter's lease page following both leases, reloaded every PAGE_RELOAD_S."""
    from websockets.exceptions import ConnectionClosed, WebSocketException
    from websockets.sync.client import connect

    while not stop.is_set():
        reload_at = time.monotonic() + PAGE_RELOAD_S
        try:
            with connect(
                f"ws://127.0.0.1:{port}/ws/live/",
                origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
                additional_headers={"Cookie": cookie},
                max_size=None,
            ) as socket:
                counters.add("page.opens")
                for lease in leases:
                    socket.send(json.dumps({"type": "logs.subscribe", "lease_id": lease}))
                while not stop.is_set() and time.monotonic() < reload_at:
                    try:
                        raw = socket.recv(timeout=1)
                    except TimeoutError:
                        continue
                    message = json.loads(raw)
                    if message.get("type") != "log":
                        continue
                    key = "page.backlog" if message.get("backlog") is not None else "page.live"
                    counters.add(f"{key}_frames")
                    counters.add(f"{key}_chars", len(message["data"]))
                    counters.add("page.dropped_markers", message["data"].count("bytes dropped"))
        except ConnectionClosed as exc:
            counters.add(f"page.closed_{exc.rcvd.code if exc.rcvd else 'none'}")
        except (OSError, WebSocketException):
            counters.add("page.errors")
            stop.wait(1)


def _api_reader(
    base: str, token: str, leases: list[str], stop: threading.Event, counters: Counters
) -> None:
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}) as client:
        n = 0
        while not stop.wait(1.0):
            lease = leases[n % len(leases)]
            n += 1
            try:
                response = client.get(f"/api/v1/leases/{lease}/logs/", timeout=10)
            except httpx.HTTPError:
                counters.add("api.errors")
                continue
            counters.add(f"api.status_{response.status_code}")
            counters.add("api.bytes", len(response.content))


def _short_leases(
    renter: Any, host: Any, spec: Any, stop: threading.Event, counters: Counters
) -> None:
    from hub.leases.services import release_lease, start_lease

    while not stop.is_set():
        started = time.monotonic()
        try:
            lease = start_lease(renter, host, [2], spec)
            lease = _wait_state(lease.pk, ("running", "failed", "ended"))
            counters.add(f"short.{lease.state}")
            stop.wait(SHORT_HELD_S)
            release_lease(lease.pk)
            _wait_state(lease.pk, ("ended", "failed"))
        except Exception as exc:  # counted and reported; the soak goes on
            counters.add("short.errors")
            print(f"short lease: {exc}", flush=True)
        stop.wait(max(0.0, SHORT_EVERY_S - (time.monotonic() - started)))


def _keep_chatty(renter: Any, host: Any, spec: Any, leases: list[str], counters: Counters) -> None:
    """One chatty lease on GPU 0 and one on GPU 1; one that ended (its container killed:
    the Docker engine may be shared) is rented again, and counted."""
    from hub.leases.models import Lease
    from hub.leases.services import start_lease

    for gpu, lease_id in enumerate(leases):
        if lease_id and Lease.objects.filter(pk=lease_id, state="running").exists():
            continue
        if lease_id:
            counters.add("chatty.rented_again")
            _wait_state(lease_id, ("ended", "failed"))
        lease = start_lease(renter, host, [gpu], spec)
        if _wait_state(lease.pk, ("running", "failed", "ended")).state != "running":
            raise RuntimeError(f"chatty lease {lease.pk} did not run")
        leases[gpu] = str(lease.pk)


def _warm_up_s(minutes: float) -> float:
    return max(300.0, minutes * 60 / 6)


def _snapshot_growth(folder: Path, process: str, top: int = 25) -> list[dict[str, Any]]:
    """What grew between a process's first and last tracemalloc snapshots ("web" or "agent"),
    by line."""
    deadline = time.monotonic() + 60
    while len(dumps := sorted(folder.glob(f"{process}-*.tracemalloc"))) < 2:
        if time.monotonic() > deadline:
            return []
        time.sleep(1)
    first, last = (tracemalloc.Snapshot.load(str(path)) for path in (dumps[0], dumps[-1]))
    return [
        {
            "where": str(stat.traceback[0]),
            "stack": [str(frame) for frame in stat.traceback][:6],
            "size_diff_kib": round(stat.size_diff / 1024, 1),
            "count_diff": stat.count_diff,
            "size_kib": round(stat.size / 1024, 1),
        }
        for stat in last.compare_to(first, "traceback")[:top]
    ]


def run(args: argparse.Namespace) -> dict[str, Any]:
    import docker
    from django.test import Client

    from hub.lib.ports import free_port
    from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env

    # Its own scratch database: other benches' cloudgpu_bench may be in use on the same server.
    common.BENCH_DATABASE = args.database
    port = free_port()
    log_dir = Path(args.log_dir) if args.log_dir else common.LOG_DIR
    log_dir.mkdir(parents=True, exist_ok=True)
    common.LOG_DIR.mkdir(parents=True, exist_ok=True)  # the agent's log (bench.dispatch)
    # INFO: the web process logs each scheduled full collection with its pause (hub/serve.py).
    env = common.bench_env(HUB_PUBLIC_URL=f"http://127.0.0.1:{port}", LOG_LEVEL="INFO")
    snapshots = log_dir / "tracemalloc"
    if args.tracemalloc:
        # The web process traces once started, and dumps a snapshot on SIGUSR2 (hub/serve.py).
        snapshots.mkdir(exist_ok=True)
        env.update(HUB_TRACEMALLOC_DIR=str(snapshots))
    common.prepare(env)
    image = common.build_busybox_image()
    common.setup_django(env)
    from hub.accounts.api_tokens import create_api_token
    from hub.leases.services import LeaseSpec, release_lease

    result: dict[str, Any] = {"figure": "soak (issue 23)", "machine": common.machine()}
    counters = Counters()
    samples: list[dict[str, float]] = []
    docker_client = docker.from_env(timeout=60)
    stop = threading.Event()
    with (
        common.Hub(env, port=port, log_dir=log_dir).start() as hub,
        tempfile.TemporaryDirectory(prefix="cloudgpu-soak-") as folder,
    ):
        supplier, renter, token = _people(env, f"soak{uuid.uuid4().hex[:4]}")
        table = FakeGpuTable.create(Path(folder) / "gpus.json", gpu_count=4)
        (Path(folder) / "locks").mkdir()
        state = Path(folder) / "agent"
        agent = _start_agent(
            hub,
            token,
            state,
            # --allow-local-images: no registry here, the image is built locally.
            [
                "--gpu-devices",
                "none",
                "--lock-dir",
                str(Path(folder) / "locks"),
                "--allow-local-images",
            ],
            agent_env(
                CLOUDGPU_CONTAINER_LOG_MIB=str(args.container_log_mib),
                # The agent too traces, and snapshots on SIGUSR2 (supplier_agent/profiling.py).
                **({"CLOUDGPU_TRACEMALLOC_DIR": str(snapshots)} if args.tracemalloc else {}),
                **fake_nvml_env(table.path),
            ),
        )
        threads: list[threading.Thread] = []
        leases: list[str] = []
        try:
            host = _wait_online(supplier)
            agent_id = (state / "agent_id").read_text().strip()
            chatty = LeaseSpec(image=image, command=["sh", "-c", CHATTY])
            leases.extend(["", ""])
            _keep_chatty(renter, host, chatty, leases, counters)
            browser = Client()
            browser.force_login(renter)
            cookie = f"sessionid={browser.cookies['sessionid'].value}"
            _, api_token = create_api_token(renter, "soak")
            short = LeaseSpec(image=image, command=["sh", "-c", SHORT])
            threads = [
                threading.Thread(target=_page, args=(port, cookie, leases, stop, counters)),
                threading.Thread(
                    target=_api_reader, args=(hub.http_url, api_token, leases, stop, counters)
                ),
                threading.Thread(target=_short_leases, args=(renter, host, short, stop, counters)),
            ]
            for thread in threads:
                thread.start()
            pids = {name: hub.pid(name) for name in ("web", "worker", "beat")}
            pids["agent"] = agent.pid
            began = time.monotonic()
            ends_at = began + args.minutes * 60
            snapshot_at = [began + _warm_up_s(args.minutes), ends_at]
            while True:
                _keep_chatty(renter, host, chatty, leases, counters)
                samples.append(_sample(env, pids, state, docker_client, agent_id))
                if args.tracemalloc and snapshot_at and time.monotonic() >= snapshot_at[0]:
                    snapshot_at.pop(0)
                    os.kill(pids["web"], signal.SIGUSR2)
                    os.kill(pids["agent"], signal.SIGUSR2)
                if time.monotonic() >= ends_at:
                    break
                print(json.dumps({k: round(v, 2) for k, v in samples[-1].items()}), flush=True)
                time.sleep(min(SAMPLE_EVERY_S, max(0.0, ends_at - time.monotonic())))
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            for lease_id in leases:
                if lease_id:
                    release_lease(lease_id)
            # The releases reach the agent through the worker: wait for its containers to go
            # before stopping it, and remove what is left after a minute (two chatty leases
            # left running would print 64 KiB/s each into the next benchmark's machine).
            id_file = state / "agent_id"
            agent_id = id_file.read_text().strip() if id_file.exists() else ""
            claim = {"label": f"cloudgpu.claim={agent_id}"}
            deadline = time.monotonic() + 60
            while agent_id and (
                left := docker_client.containers.list(all=True, filters=claim, ignore_removed=True)
            ):
                if time.monotonic() > deadline:
                    for container in left:
                        container.remove(force=True)
                    break
                time.sleep(1)
            common.stop_tree(agent)
    docker_client.close()
    warm_up_s = _warm_up_s(args.minutes)
    if args.tracemalloc:
        result["tracemalloc_growth"] = _snapshot_growth(snapshots, "web")
        result["agent_tracemalloc_growth"] = _snapshot_growth(snapshots, "agent")
    start = samples[0]["t"]
    settled = [s for s in samples if s["t"] - start >= warm_up_s] or samples
    keys = [k for k in samples[-1] if k != "t"]
    result.update(
        minutes=args.minutes,
        container_log_mib=args.container_log_mib,
        warm_up_s=warm_up_s,
        samples=len(samples),
        counters=counters.values,
        growth_per_hour={k: round(_slope_per_hour(settled, k), 3) for k in keys},
        floor_growth_per_hour={
            k: None if (slope := _floor_slope_per_hour(settled, k)) is None else round(slope, 3)
            for k in keys
            if k.endswith(".rss_mib")
        },
        first={k: round(settled[0].get(k, 0), 2) for k in keys},
        last={k: round(samples[-1][k], 2) for k in keys},
        peak={k: round(max(s.get(k, 0) for s in samples), 2) for k in keys},
        raw=[{k: round(v, 2) for k, v in s.items()} for s in samples],
    )
    return result


def agent_leases(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.agents import agent_env, configure, new_token, running_agent
    from tests.support.hub_peer import HubPeer

    result: dict[str, Any] = {"figure": "agent RSS over many leases", "machine": common.machine()}
    rss: list[tuple[int, float]] = []
    token = new_token()
    every = args.sample_every or (1000 if args.runtime == "mock" else 50)
    run_fields: dict[str, Any] = {"image": "busybox:latest", "ports": [80]}
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="cloudgpu-soak-agent-") as folder,
        HubPeer(token) as hub,
    ):
        state = Path(folder) / "state"
        options = ["--runtime", args.runtime]
        env = agent_env()
        if args.runtime == "docker":
            from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env

            # Real containers (a log follower each, the Docker SDK's calls on threads), as the
            # soak's short leases but back to back: the thread churn that native memory follows.
            # It exits on the release's SIGTERM (a shell as PID 1 would ignore it: 10 s each).
            quick = "trap 'exit 0' TERM; echo short lease; sleep 3600 & wait"
            run_fields = {"image": common.build_busybox_image(), "command": ["sh", "-c", quick]}
            table = FakeGpuTable.create(Path(folder) / "gpus.json", gpu_count=1)
            (Path(folder) / "locks").mkdir()
            options += ["--gpu-devices", "none", "--lock-dir", str(Path(folder) / "locks")]
            options += ["--allow-local-images"]  # no registry here: the image is built locally
            env = agent_env(**fake_nvml_env(table.path))
        if configure(state, hub.url, token, *options, env=env).returncode != 0:
            raise RuntimeError("configure failed")
        log = Path(folder) / "agent.log"
        with running_agent(state, log, "--log-level", "WARNING", env=env) as agent:
            conn = hub.wait_for_connection()
            hub.wait_for(conn, "register")
            process = psutil.Process(agent.pid)
            rss.append((0, process.memory_info().rss / 2**20))
            for n in range(1, args.leases + 1):
                lease = str(uuid.uuid4())
                for kind, fields in (
                    ("reserve", {"gpus": "0"}),
                    ("docker_run", run_fields),
                    ("release", {"reason": "renter_stop"}),
                ):
                    ack = hub.command(conn, kind, lease, n, **fields)
                    if not ack.ok:
                        raise RuntimeError(f"{kind} of lease {n}: {ack.error}")
                with hub._cond:
                    conn.received.clear()  # the peer's own record, not the agent's
                if n % every == 0:
                    rss.append((n, process.memory_info().rss / 2**20))
                    print(
                        f"{n} leases, {time.monotonic() - started:.0f} s:"
                        f" agent RSS {rss[-1][1]:.1f} MiB, {process.num_threads()} threads",
                        flush=True,
                    )
            state_kib = _folder_bytes(state) / 1024
    result.update(
        runtime=args.runtime,
        leases=args.leases,
        seconds=round(time.monotonic() - started),
        rss_mib=[[n, round(v, 1)] for n, v in rss],
        state_folder_kib=round(state_kib),
        goal="RSS <= 40 MB after 20,000 leases",
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    soak = sub.add_parser("run")
    soak.add_argument("--minutes", type=float, default=30.0)
    soak.add_argument(
        "--container-log-mib",
        type=int,
        default=16,
        help="the agent's container_log_mib: small, so the bound is reached within the run",
    )
    soak.add_argument("--database", default="cloudgpu_soak", help="scratch database's name")
    soak.add_argument("--log-dir", default="", help="the hub's logs (default bench's own)")
    soak.add_argument(
        "--tracemalloc",
        action="store_true",
        help="trace the web process's and the agent's allocations and report what grew after "
        "the warm-up "
        "(slower, and RSS then includes tracemalloc's own)",
    )
    soak.add_argument("--result", default="soak", help="bench/results/<name>.json")
    leases = sub.add_parser("agent-leases")
    leases.add_argument("--leases", type=int, default=20000)
    leases.add_argument(
        "--runtime",
        choices=("mock", "docker"),
        default="mock",
        help="docker: a real busybox container per lease (about a second each)",
    )
    leases.add_argument("--sample-every", type=int, default=0, help="leases between samples")
    leases.add_argument("--result", default="soak-agent-leases", help="bench/results/<name>.json")
    args = parser.parse_args()
    if args.mode == "run":
        common.write_result(args.result, run(args))
    else:
        common.write_result(args.result, agent_leases(args))


if __name__ == "__main__":
    main()
