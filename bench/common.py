"""What every bench script shares: the scratch services, the hub's processes, the raw baselines
and the statistics. Figures are only ever reported next to baselines measured in the same run.

Services: the server named by DATABASE_URL (a scratch database ``cloudgpu_bench`` on it is
dropped, re-created and migrated for every script) and the Redis of REDIS_URL (only the bench's
own keys are touched: a per-run Channels prefix, the liveness key). `make bench` runs the
scripts under ``hub.runner exec``, which starts an embedded Postgres and Redis when neither URL
is set.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg
import redis

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hub.lib.env import database_from_url  # noqa: E402
from hub.lib.ports import free_port, wait_for_port  # noqa: E402

RESULTS_DIR = REPO / "bench" / "results"
LOG_DIR = REPO / ".state" / "bench-logs"
# Its own name per engineer on a shared machine: prepare() drops and recreates it.
BENCH_DATABASE = os.environ.get("BENCH_DATABASE", "cloudgpu_bench")
FAKE_NVML_DIR = REPO / "tests" / "fakes" / "nvml"
BUSYBOX_STATIC = Path("/bin/busybox")
BUSYBOX_IMAGE = "cloudgpu-bench/busybox:latest"
AGENT = str(Path(sys.executable).with_name("cloudgpu-agent"))

# The control-plane timings divided by 15, for the time-compressed mode: one heartbeat a second
# costs the hub what one every 15 s does, periodic Postgres writes included.
COMPRESSED_TIMINGS = {
    "AGENT_HEARTBEAT_INTERVAL_S": "1",
    "HOST_OFFLINE_AFTER_S": "3",
    "HOST_STATS_WRITE_INTERVAL_S": "4",
    "HOST_STATS_FLUSH_INTERVAL_S": "1",
    "SWEEP_INTERVAL_S": "1",
}


# --- statistics ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def summary(values: Sequence[float], digits: int = 2) -> dict[str, float | int]:
    return {
        "n": len(values),
        "p50": round(percentile(values, 50), digits),
        "p99": round(percentile(values, 99), digits),
        "max": round(max(values), digits) if values else float("nan"),
    }


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --- environment and machine --------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """Where and when: put next to every result."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    # BENCH_COMMIT: set when running from an exported snapshot (`git archive`), which is how
    # to measure one commit while the working tree keeps changing.
    commit = (
        os.environ.get("BENCH_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
    )
    dirty = (
        ""
        if os.environ.get("BENCH_COMMIT")
        else subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit + ("+dirty" if dirty else ""),
        "cpu": cpu,
        "cores": psutil.cpu_count(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def scratch_database_url(url: str) -> str:
    """The same server and credentials, database ``cloudgpu_bench``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{BENCH_DATABASE}"))


def pg_conninfo(url: str) -> dict[str, Any]:
    db = database_from_url(url)
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": int(db["PORT"] or 5432),
        "user": db["USER"],
        "password": db["PASSWORD"] or None,
        "dbname": db["NAME"],
    }


def recreate_database(url: str) -> None:
    info = dict(pg_conninfo(url), dbname="postgres")
    with psycopg.connect(**info, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{BENCH_DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{BENCH_DATABASE}"')


def bench_env(**overrides: str) -> dict[str, str]:
    """The hub's environment on the scratch database, with a per-run Channels prefix."""
    env = dict(os.environ)
    if not env.get("DATABASE_URL") or not env.get("REDIS_URL"):
        raise SystemExit(
            "DATABASE_URL and REDIS_URL must be set; run through `make bench`, or "
            "`python -m hub.runner exec --state .state/bench -- python -m bench.<script>`"
        )
    env["DATABASE_URL"] = scratch_database_url(env["DATABASE_URL"])
    env.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
    # Production settings (DEBUG off: no query log kept per connection), with a throwaway key.
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    env.update(
        DEBUG="0",
        PYTHONUNBUFFERED="1",
        LOG_LEVEL="WARNING",
        CHANNELS_PREFIX=f"cloudgpu-bench-{uuid.uuid4().hex[:6]}",
        # Every Redis key of this run under its own prefix (a live hub may share the Redis).
        REDIS_KEY_PREFIX=f"cloudgpu-bench-{uuid.uuid4().hex[:6]}",
        # The swarm registers thousands of hosts with one supplier token; production's cap per
        # token (256) would refuse all but the first.
        MAX_HOSTS_PER_TOKEN="1000000",  # noqa: S106 (a count, not a secret)
    )
    env.update(overrides)
    return env


def prepare(env: dict[str, str]) -> None:
    """Fresh scratch database, migrated; the bench's liveness key in Redis cleared."""
    recreate_database(env["DATABASE_URL"])
    manage(env, "migrate", "--noinput", "-v", "0")
    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(**pg_conninfo(env["DATABASE_URL"]), autocommit=True) as conn,
    ):
        # Statement counts where the server preloads it (the embedded Postgres does).
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    client = redis.Redis.from_url(env["REDIS_URL"])
    prefix = env.get("REDIS_KEY_PREFIX", "cloudgpu")
    client.delete(f"{prefix}:host-liveness", f"{prefix}:host-telemetry-pending")
    client.close()


def manage(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout.strip()


def create_user_and_token(env: dict[str, str], username: str) -> str:
    manage(
        env,
        "shell",
        "-c",
        f"from hub.accounts.models import User; User.objects.create_user('{username}')",
    )
    # Its hosts' GPUs are listed at $0 when they first report (new GPUs are otherwise unlisted).
    return manage(env, "hub", "token", "create", "--owner", username, "--default-price", "0")


# Reads "prefix digest" lines on stdin: one supplier and one token per line.
_ONE_HOST_SUPPLIERS = """
import sys
from hub.accounts.models import User
from hub.suppliers.models import AgentToken
rows = [line.split() for line in sys.stdin.read().splitlines()]
users = User.objects.bulk_create(
    [User(username=f"bench-host-{n}") for n in range(len(rows))], batch_size=1000
)
AgentToken.objects.bulk_create(
    [
        AgentToken(owner=u, prefix=p, digest=d, default_price_per_hour_micros=0)
        for u, (p, d) in zip(users, rows)
    ],
    batch_size=1000,
)
"""


def create_one_host_suppliers(env: dict[str, str], count: int, folder: Path) -> Path:
    """``count`` suppliers with a token each, as a fleet of one-host suppliers is: no token is
    shared, so no socket benefits from another's token check. Returns the file of the tokens'
    plaintexts, one per line (mode 0600; the Django process sees only their digests)."""
    from hub.lib import tokens

    plaintexts = [tokens.generate_token() for _ in range(count)]
    manage(
        env,
        "shell",
        "-c",
        _ONE_HOST_SUPPLIERS,
        stdin="".join(f"{tokens.visible_prefix(t)} {tokens.digest(t)}\n" for t in plaintexts),
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "bench-tokens.txt"
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f"{t}\n" for t in plaintexts))
    return path


def setup_django(env: dict[str, str]) -> None:
    """Use the hub's models and services in this process (same database as the hub)."""
    keys = ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "DEBUG", "CHANNELS_PREFIX")
    for key in (*keys, "REDIS_KEY_PREFIX", "MAX_HOSTS_PER_TOKEN"):
        os.environ[key] = env[key]
    os.environ["SECRET_KEY"] = env["SECRET_KEY"]
    os.environ.update({k: v for k, v in env.items() if k.endswith("_S")})
    import django

    django.setup()


# --- the hub's processes ------------------------------------------------------------------------


@dataclass
class Hub:
    """One Daphne (or ``webs`` of them: "web", "web-2", ...), one Celery worker (as `make run`
    starts it) and beat."""

    env: dict[str, str]
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    log_dir: Path = LOG_DIR
    webs: int = 1
    more_ports: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.more_ports = [free_port() for _ in range(self.webs - 1)]

    @property
    def web_names(self) -> list[str]:
        return ["web", *(f"web-{n}" for n in range(2, self.webs + 1))]

    @property
    def ws_url(self) -> str:
        """Every web process's agent URL, comma-separated (the swarm spreads its agents)."""
        return ",".join(
            f"ws://127.0.0.1:{port}/api/p2p/ws/" for port in [self.port, *self.more_ports]
        )

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, name: str, argv: list[str]) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start_web(self, only: str | None = None) -> None:
        ports = dict(zip(self.web_names, [self.port, *self.more_ports], strict=True))
        for name, port in ports.items():
            if only is not None and name != only:
                continue
            self._start(
                name,
                [sys.executable, "-m", "hub.serve", "-v", "0", "-b", "127.0.0.1", "-p", str(port),
                 "hub.asgi:application"],
            )  # fmt: skip
        for name, port in ports.items():
            if (only is None or name == only) and not wait_for_port(port, timeout_s=60):
                raise RuntimeError(f"Daphne did not listen; see {self.log_dir / f'{name}.log'}")

    def start(self, *, worker: bool = True, beat: bool = True) -> Hub:
        celery = [sys.executable, "-m", "celery", "-A", "hub"]
        if worker:
            self._start(
                "worker",
                [
                    *celery,
                    "worker",
                    "-l",
                    "WARNING",
                    "-c",
                    "2",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
            )  # as `make run` starts it
        if beat:
            schedule = self.log_dir / f"celerybeat-schedule-{self.port}"
            self._start("beat", [*celery, "beat", "-l", "WARNING", "-s", str(schedule)])
        self.start_web()
        return self

    def stop_web(self, only: str | None = None) -> None:
        for name in self.web_names:
            if only is None or name == only:
                stop_tree(self.processes.pop(name))

    def stop(self) -> None:
        for name in list(self.processes):
            stop_tree(self.processes.pop(name))

    def pid(self, name: str) -> int:
        return self.processes[name].pid

    def process_count(self) -> int:
        """Hub processes, the worker's pool children included."""
        total = 0
        for process in self.processes.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                total += 1 + len(psutil.Process(process.pid).children(recursive=True))
        return total

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_tree(process: subprocess.Popen[Any], timeout_s: float = 20.0) -> None:
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


class CpuMeter:
    """CPU time of some processes (and their children) between two reads, in % of one core."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.started = time.monotonic()
        self.start_times = {name: self._cpu(p) for name, p in self.processes.items()}

    @staticmethod
    def _cpu(process: psutil.Process) -> float:
        total = 0.0
        with contextlib.suppress(psutil.NoSuchProcess):
            for p in (process, *process.children(recursive=True)):
                with contextlib.suppress(psutil.NoSuchProcess):
                    times = p.cpu_times()
                    total += times.user + times.system
        return total

    def percent(self) -> dict[str, float]:
        elapsed = time.monotonic() - self.started
        return {
            name: round(100 * (self._cpu(p) - self.start_times[name]) / elapsed, 1)
            for name, p in self.processes.items()
        }


def server_pids() -> dict[str, int]:
    """Postgres and Redis servers on this machine (for CPU shares), where they can be found."""
    found: dict[str, int] = {}
    for process in psutil.process_iter(["name", "ppid"]):
        name = process.info["name"] or ""
        if name in ("postgres", "postmaster") and "postgres" not in found:
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.parent() is None or process.parent().name() not in (
                    "postgres",
                    "postmaster",
                ):
                    found["postgres"] = process.pid
        elif name.startswith("redis-server") and "redis" not in found:
            found["redis"] = process.pid
    return found


# --- raw baselines ------------------------------------------------------------------------------


def baseline_pg1(url: str, seconds: float = 3.0) -> float:
    """B_pg1: single-row UPDATEs per second, one client, autocommit."""
    with psycopg.connect(**pg_conninfo(url), autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE b (id int primary key, n bigint)")
        conn.execute("INSERT INTO b VALUES (1, 0)")
        done, deadline = 0, time.perf_counter() + seconds
        started = time.perf_counter()
        while time.perf_counter() < deadline:
            conn.execute("UPDATE b SET n = n + 1 WHERE id = 1")
            done += 1
        return done / (time.perf_counter() - started)


def baseline_pgbatch(url: str, seconds: float = 3.0, batch: int = 100) -> float:
    """B_pgbatch: rows per second updated in batches of 100 (one statement, one commit each)."""
    with psycopg.connect(**pg_conninfo(url), autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE bb (id int primary key, n bigint)")
        conn.execute("INSERT INTO bb SELECT g, 0 FROM generate_series(1, %s) g", [batch * 10])
        rows, offset = 0, 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            conn.execute(
                "UPDATE bb SET n = n + 1 WHERE id > %s AND id <= %s", [offset, offset + batch]
            )
            rows += batch
            offset = (offset + batch) % (batch * 10)
        return rows / (time.perf_counter() - started)


def baseline_rtt(url: str, count: int = 2000) -> float:
    """B_rtt: median Redis PING round trip, in seconds."""
    client = redis.Redis.from_url(url)
    client.ping()
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        client.ping()
        samples.append(time.perf_counter() - start)
    client.close()
    return statistics.median(samples)


def baseline_celery(env: dict[str, str], count: int = 40) -> dict[str, float]:
    """B_celery: publish-to-start of a no-op task on a worker started like the hub's (same
    broker, pool and prefetch settings); median and p99 in seconds."""
    from bench import celery_noop

    log = LOG_DIR / "celery-noop.log"
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bench.celery_noop", "worker", "-l", "WARNING",
             "-c", "2", "-Q", celery_noop.QUEUE, "-n", f"bench-noop-{os.getpid()}@%h"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        app = celery_noop.make_app(env["REDIS_URL"])
        app.send_task(celery_noop.TASK, args=[time.time()], queue=celery_noop.QUEUE).get(
            timeout=60
        )  # warm: the worker is up and its pool started
        samples = []
        for _ in range(count):
            result = app.send_task(celery_noop.TASK, args=[time.time()], queue=celery_noop.QUEUE)
            samples.append(float(result.get(timeout=30)))
            time.sleep(0.05)
        app.close()
    finally:
        stop_tree(worker)
    return {"p50": median(samples), "p99": percentile(samples, 99)}


def build_busybox_image() -> str:
    """A tiny local image from Debian's busybox-static (no registry is reachable)."""
    import io
    import tarfile

    import docker

    client = docker.from_env(timeout=60)
    dockerfile = (
        b"FROM scratch\n"
        b"COPY busybox /bin/busybox\n"
        b'RUN ["/bin/busybox", "--install", "-s", "/bin"]\n'
        b'CMD ["/bin/sh"]\n'
    )
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (("Dockerfile", dockerfile), ("busybox", BUSYBOX_STATIC.read_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    client.images.build(fileobj=context, custom_context=True, tag=BUSYBOX_IMAGE, rm=True)
    client.close()
    return BUSYBOX_IMAGE


def baseline_docker(image: str, count: int = 10) -> dict[str, float]:
    """B_docker: `docker run -d` of a cached local image until it is running (SDK: create,
    start, inspect until running); median and p99 in seconds."""
    import docker

    client = docker.from_env(timeout=60)
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        container = client.containers.run(
            image, ["sleep", "300"], detach=True, labels={"cloudgpu.bench": "baseline"}
        )
        while True:
            container.reload()
            if container.status == "running":
                break
            time.sleep(0.005)
        samples.append(time.perf_counter() - start)
        container.remove(force=True)
    client.close()
    return {"p50": median(samples), "p99": percentile(samples, 99)}


# --- Postgres counters --------------------------------------------------------------------------


def pg_snapshot(url: str) -> dict[str, int]:
    """Counters of the scratch database: statements (pg_stat_statements, where the server
    preloads it: the embedded Postgres does), commits, table accesses (seq + index scans: a
    proxy for statements, but a batched UPDATE joined through an index counts one per row),
    row writes and heap-only (HOT) updates."""
    with psycopg.connect(**pg_conninfo(url), autocommit=True) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        tables = conn.execute(
            "SELECT coalesce(sum(coalesce(seq_scan, 0) + coalesce(idx_scan, 0)), 0),"
            " coalesce(sum(n_tup_upd), 0), coalesce(sum(n_tup_hot_upd), 0),"
            " coalesce(sum(n_tup_ins), 0) FROM pg_stat_user_tables"
        ).fetchone()
        statements = None
        with contextlib.suppress(psycopg.Error):
            # Statements the hub sends, and apart from them the foreign-key checks Postgres runs
            # itself per inserted row (pg_stat_statements lists those as statements too).
            statements = conn.execute(
                "SELECT coalesce(sum(calls) FILTER (WHERE query NOT LIKE %(fk)s), 0),"
                " coalesce(sum(calls) FILTER (WHERE query LIKE %(fk)s), 0)"
                " FROM pg_stat_statements s JOIN pg_database d"
                " ON d.oid = s.dbid WHERE d.datname = current_database()",
                {"fk": "SELECT $2 FROM ONLY % FOR KEY SHARE OF x"},
            ).fetchone()
    assert commits is not None
    assert tables is not None
    snapshot = {
        "commits": int(commits[0]),
        "table_accesses": int(tables[0]),
        "rows_updated": int(tables[1]),
        "hot_updates": int(tables[2]),
        "rows_inserted": int(tables[3]),
    }
    if statements is not None and statements[0] is not None:
        snapshot["statements"] = int(statements[0])
        snapshot["fk_checks"] = int(statements[1])
    return snapshot


def pg_flush_stats(url: str) -> None:
    # Backends report their counters to the stats system when idle for a second; wait for them.
    time.sleep(1.5)


def pg_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {key: after[key] - before.get(key, 0) for key in after}


# --- results ------------------------------------------------------------------------------------


def write_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2), flush=True)
    print(f"written to {path.relative_to(REPO)}", flush=True)
    return path


def ms(seconds: float) -> float:
    return round(seconds * 1000, 2)


@contextlib.contextmanager
def timed(label: str) -> Iterator[None]:
    started = time.perf_counter()
    yield
    print(f"[bench] {label}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
