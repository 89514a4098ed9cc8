"""Web load (issue 16): the API and the dashboard pages under 8-64 concurrent clients.

    python -m bench.web_load --clients 8,32,64 --seconds 120

A renter (API token and a logged-in session) and anonymous visitors request a mix of pages in
closed loops for ``--seconds`` per concurrency level, against a hub started as `make run` starts
it (one Daphne, a Celery worker, beat). Reported per level: requests/s, p50/p99/max latency,
answers by status (any 5xx is a failure), and the Postgres connections the hub's processes hold,
sampled every second from the operating system's socket table, plus the count a while after the
traffic stops. ``--set DATABASE_POOL_MAX_SIZE=4`` runs with a hub setting changed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import threading
import time
from typing import Any

import httpx
import psutil

from bench import common

ANONYMOUS = ["/", "/offers/", "/healthz", "/api/schema/", "/login/"]
API = ["/api/v1/leases/", "/api/v1/account/", "/api/v1/offers/", "/api/v1/templates/"]
DASHBOARD = ["/leases/", "/usage/", "/account/api-tokens/", "/supplier/hosts/"]


def renter_credentials(env: dict[str, str]) -> tuple[str, str]:
    """An API token and a session cookie of one renter, made straight in the bench database."""
    common.setup_django(env)
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    from hub.accounts.api_tokens import create_api_token
    from hub.accounts.models import User

    user = User.objects.create_user("bench-renter")
    token = create_api_token(user, "web load")[1]
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = settings.AUTHENTICATION_BACKENDS[0]
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.create()
    assert session.session_key is not None
    return token, session.session_key


def postgres_connections(hub: common.Hub, port: int) -> dict[str, int]:
    """Established connections to Postgres per hub process (children counted with theirs)."""
    counts: dict[str, int] = {}
    for name, process in hub.processes.items():
        total = 0
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(process.pid)
            for p in (root, *root.children(recursive=True)):
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += sum(
                        1
                        for c in p.net_connections(kind="tcp")
                        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
                    )
        counts[name] = total
    return counts


class ConnectionSampler:
    """Samples the hub's Postgres connections once a second in a thread."""

    def __init__(self, hub: common.Hub, port: int) -> None:
        self.hub, self.port = hub, port
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            counts = postgres_connections(self.hub, self.port)
            self.samples.append(
                {
                    "t": round(time.monotonic() - self._started, 1),
                    **counts,
                    "total": sum(counts.values()),
                }
            )
            self._stop.wait(1.0)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, since: float = 0.0) -> int:
        return max((s["total"] for s in self.samples if s["t"] >= since), default=0)


async def load(base: str, token: str, session: str, clients: int, seconds: float) -> dict[str, Any]:
    requests = itertools.cycle(
        [(p, {}) for p in ANONYMOUS]
        + [(p, {"Authorization": f"Bearer {token}"}) for p in API]
        + [(p, {"Cookie": f"sessionid={session}"}) for p in DASHBOARD]
    )
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors: dict[str, int] = {}
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as client:

        async def one_client() -> None:
            while time.monotonic() < deadline:
                path, headers = next(requests)
                started = time.perf_counter()
                try:
                    response = await client.get(path, headers=headers)
                except httpx.HTTPError as exc:
                    errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                    continue
                latencies.append(time.perf_counter() - started)
                key = str(response.status_code)
                statuses[key] = statuses.get(key, 0) + 1

        started = time.monotonic()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.monotonic() - started
    return {
        "clients": clients,
        "seconds": round(elapsed, 1),
        "requests": len(latencies),
        "requests_per_s": round(len(latencies) / elapsed, 1),
        "latency_ms": common.summary([x * 1000 for x in latencies]),
        "statuses": statuses,
        "server_errors": sum(n for s, n in statuses.items() if s.startswith("5")),
        "client_errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="8,32,64", help="concurrency levels, in order")
    parser.add_argument("--seconds", type=float, default=120.0, help="per level")
    parser.add_argument("--idle", type=float, default=75.0, help="watched after the traffic")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--name", default="web-load")
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.set)
    env = common.bench_env(**overrides)
    common.prepare(env)
    token, session = renter_credentials(env)
    port = common.pg_conninfo(env["DATABASE_URL"])["port"]
    result: dict[str, Any] = {
        "figure": "web load",
        "machine": common.machine(),
        "settings": overrides,
        "baselines": {"B_pg1_updates_per_s": round(common.baseline_pg1(env["DATABASE_URL"]))},
    }
    levels = []
    with common.Hub(env).start() as hub, ConnectionSampler(hub, port) as sampler:
        for clients in (int(c) for c in args.clients.split(",")):
            since = sampler.samples[-1]["t"] if sampler.samples else 0.0
            level = asyncio.run(load(hub.http_url, token, session, clients, args.seconds))
            level["postgres_connections_peak"] = sampler.peak(since)
            levels.append(level)
            print(
                f"{clients:>3} clients: {level['requests_per_s']:>7.1f} req/s, "
                f"p50 {level['latency_ms']['p50']} ms, p99 {level['latency_ms']['p99']} ms, "
                f"5xx {level['server_errors']}, Postgres connections peak "
                f"{level['postgres_connections_peak']}",
                flush=True,
            )
        traffic_ended = sampler.samples[-1]["t"] if sampler.samples else 0.0
        time.sleep(args.idle)  # the pools' idle connections above min_size close after 60 s
        result["postgres_connections_after_idle"] = postgres_connections(hub, port)
        result["postgres_connections_peak_after_traffic"] = sampler.peak(traffic_ended + 1)
    result["levels"] = levels
    result["postgres_connections_over_time"] = sampler.samples
    print(f"after {args.idle:.0f} s idle: {result['postgres_connections_after_idle']}")
    common.write_result(args.name, result)
    if any(level["server_errors"] or level["client_errors"] for level in levels):
        raise SystemExit("some requests failed (see the statuses above)")


if __name__ == "__main__":
    main()
