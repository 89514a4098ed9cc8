"""A whole hub in real processes for end-to-end tests: Daphne (one or more), a Celery worker
and Celery beat, on the test database and a Redis of the test's choosing, with the
control-plane timings shortened so that tests finish in seconds."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import redis
from django.db import connection

from hub.lib.ports import free_port, wait_for_port
from tests.support.processes import REPO_ROOT, hub_env, python_module, running

FAST_TIMINGS = {
    "AGENT_HEARTBEAT_INTERVAL_S": "1",
    "HOST_OFFLINE_AFTER_S": "3",
    "HOST_STATS_WRITE_INTERVAL_S": "5",
    "SWEEP_INTERVAL_S": "1",
    "COMMAND_RESEND_S": "2",
    "LEASE_HOST_GRACE_S": "600",
    # The sign-up throttle counts per address in Redis, across test runs on this machine: the
    # browser tests sign up from 127.0.0.1 on every run (test_login_limits tests the throttle).
    "SIGNUP_RATE_LIMIT": "100000",
    # Likewise the failed enrollment-code exchanges from 127.0.0.1 (the installer tests make
    # some on purpose); tests/hub/installer/test_enrollment.py tests that limit.
    "ENROLLMENT_RATE_LIMIT": "100000",
}


def test_database_url() -> str:
    """The database pytest-django made, for the hub's own processes to share."""
    s = connection.settings_dict
    auth = quote(s["USER"] or "")
    if s["PASSWORD"]:
        auth += ":" + quote(s["PASSWORD"])
    host = s["HOST"] or "127.0.0.1"
    port = s["PORT"] or "5432"
    return f"postgres://{auth}@{host}:{port}/{s['NAME']}"


@dataclass
class HubStack:
    web_ports: list[int]
    env: dict[str, str]
    logs: list[Path] = field(default_factory=list)
    web_pids: list[int] = field(default_factory=list)

    def manage(self, *args: str) -> str:
        """Run `manage.py ARGS` against this hub (its database and Redis); its stdout."""
        result = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=REPO_ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    def url(self, n: int = 0) -> str:
        return f"http://127.0.0.1:{self.web_ports[n]}"

    def log_text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())


@contextmanager
def hub_stack(
    log_dir: Path,
    *,
    webs: int = 1,
    redis_url: str | None = None,
    public: bool = False,
    **settings: str,
) -> Iterator[HubStack]:
    """``public``: the first Daphne is HUB_PUBLIC_URL, so install commands shown point at it."""
    overrides = {"DATABASE_URL": test_database_url(), "DEBUG": "1", **FAST_TIMINGS, **settings}
    if redis_url:
        overrides["REDIS_URL"] = redis_url
    web_ports = [free_port() for _ in range(webs)]
    if public:
        overrides["HUB_PUBLIC_URL"] = f"http://127.0.0.1:{web_ports[0]}"
    # The live socket takes only the hub's own origins: here, each Daphne's.
    overrides.setdefault(
        "CSRF_TRUSTED_ORIGINS", ",".join(f"http://127.0.0.1:{port}" for port in web_ports)
    )
    env = hub_env(**overrides)
    stack = HubStack(web_ports=web_ports, env=env)
    _forget_earlier_stacks(env)
    with ExitStack() as processes:
        for n, port in enumerate(stack.web_ports):
            log = log_dir / f"web-{n}.log"
            stack.logs.append(log)
            web = processes.enter_context(
                running(
                    python_module(
                        "hub.serve", "-b", "127.0.0.1", "-p", str(port), "hub.asgi:application"
                    ),
                    env=env,
                    log=log,
                )
            )
            stack.web_pids.append(web.pid)
        for name, argv in (
            (
                "worker",
                [
                    "worker",
                    "-P",
                    "solo",
                    "-c",
                    "1",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
            ),
            ("beat", ["beat", "-s", str(log_dir / "celerybeat-schedule")]),
        ):
            log = log_dir / f"{name}.log"
            stack.logs.append(log)
            processes.enter_context(
                running(python_module("celery", "-A", "hub", *argv, "-l", "INFO"), env=env, log=log)
            )
        for port in stack.web_ports:
            assert wait_for_port(port, timeout_s=60), f"Daphne on {port} did not listen"
        yield stack


# The hub's own keys about hosts (hub/lib/redis_keys.py names): each test's database numbers
# hosts from 1 again, but these outlive it.
_HOST_KEYS = ("host-liveness", "host-telemetry-pending", "web-started-at", "storm-hold-since")


def _forget_earlier_stacks(env: dict[str, str]) -> None:
    """Drop what earlier tests' hubs left in the shared Redis about their hosts: deadlines long
    overdue by now (under ids this test's hosts will reuse), telemetry, and the reconnect-storm
    marks. A crowd of overdue strangers would look like a storm to this stack's offline sweep
    (hub/agents/storm.py), which would then hold instead of marking a killed agent offline."""
    prefix = env.get("REDIS_KEY_PREFIX", "cloudgpu")
    client = redis.Redis.from_url(env["REDIS_URL"])
    try:
        stale = [f"{prefix}:{name}" for name in _HOST_KEYS]
        stale += client.scan_iter(match=f"{prefix}:reregistrations:*", count=1000)
        client.delete(*stale)
    finally:
        client.close()


@contextmanager
def web_only(log: Path, **settings: str) -> Iterator[int]:
    """One Daphne (no worker, no beat) on the test database unless ``settings`` say otherwise;
    yields its port once it listens."""
    env = hub_env(**{"DATABASE_URL": test_database_url(), "DEBUG": "1", **settings})
    port = free_port()
    argv = python_module("hub.serve", "-b", "127.0.0.1", "-p", str(port), "hub.asgi:application")
    with running(argv, env=env, log=log):
        assert wait_for_port(port, timeout_s=60), f"Daphne on {port} did not listen"
        yield port
