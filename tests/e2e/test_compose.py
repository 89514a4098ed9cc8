"""`docker compose up`, proven (issue 18 item 3): docker-compose.yml with CI's override (images
built from Debian's packages, no registry) starts Postgres, Redis, two web replicas behind nginx,
the worker, beat and the gateway; a real agent registers through nginx, and a renter's rental
starts, answers at its URL through the gateway container and stops, each command sent through
one replica while the agent sits on one of them."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hub.lib.ports import free_port
from tests.support.agents import configure, running_agent
from tests.support.polling import wait_for
from tests.support.processes import REPO_ROOT

pytestmark = pytest.mark.docker

ARTIFACTS = REPO_ROOT / ".state" / "artifacts" / "compose"
SERVICES = ("postgres", "redis", "web", "worker", "beat", "proxy", "gateway")
_PASSWORD = re.compile(r"demo-account username=(\w+) password=(\S+)")

# Run inside a web replica: one API call to that replica itself, the token from stdin (never an
# argument), the reply as JSON on stdout.
_CALL_REPLICA = """
import json, sys, urllib.error, urllib.request
request = json.loads(sys.stdin.read())
call = urllib.request.Request(
    "http://127.0.0.1:8000" + request["path"],
    data=json.dumps(request["body"]).encode(),
    method="POST",
    headers={"Authorization": "Bearer " + request["token"], "Content-Type": "application/json"},
)
try:
    with urllib.request.urlopen(call, timeout=30) as reply:
        print(json.dumps({"status": reply.status, "body": json.loads(reply.read() or b"null")}))
except urllib.error.HTTPError as error:
    print(json.dumps({"status": error.code, "body": error.read().decode()}))
"""


# Run inside a web replica: its own /metrics over loopback (METRICS_ALLOW_IPS' default).
_READ_METRICS = """
import urllib.request
print(urllib.request.urlopen("http://127.0.0.1:8000/metrics", timeout=30).read().decode())
"""


def _unavailable(reason: str) -> None:
    if os.environ.get("CLOUDGPU_REQUIRE_DOCKER") == "1":
        pytest.fail(f"CLOUDGPU_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@dataclass
class Stack:
    compose: list[str]
    env: dict[str, str]
    url: str
    edge_port: int

    def run(self, *args: str, stdin: str | None = None, timeout: int = 120) -> str:
        result = subprocess.run(
            [*self.compose, *args],
            cwd=REPO_ROOT,
            env=self.env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
        return result.stdout

    def containers(self, service: str) -> list[str]:
        return self.run("ps", "-q", service).split()

    def manage(self, *args: str) -> str:
        return self.run("exec", "-T", "web", "python", "manage.py", *args)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    compose_cli = shutil.which("docker-compose")
    if compose_cli is None:
        _unavailable("docker-compose is not installed (apt-get install docker-compose)")
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        _unavailable("the CI base image needs root and debootstrap (apt-get install debootstrap)")
    built = subprocess.run(
        [str(REPO_ROOT / ".ci" / "compose" / "base-image")],
        env=os.environ | {"PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert built.returncode == 0, f"base image: {built.stderr}"
    project = f"cloudgpu-compose-{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp("compose")
    http_port, ssh_port, edge_port = free_port(), free_port(), free_port()
    url = f"http://127.0.0.1:{http_port}"
    env_file = folder / "hub.env"
    env_file.write_text(
        "\n".join(
            [
                f"SECRET_KEY={secrets.token_urlsafe(50)}",
                f"HUB_PUBLIC_URL={url}",
                "DEBUG=0",
                "DATABASE_POOL_MAX_SIZE=4",
                f"TUNNEL_GATEWAY_SECRET={(secret := secrets.token_urlsafe(32))}",
                # Rentals' URLs through the gateway container, as the local trial has them:
                # http://<id>-i.localhost:<edge port>/, agents' ssh -R to its published port.
                "TUNNEL_DOMAIN=localhost",
                "TUNNEL_URL_SCHEME=http",
                f"TUNNEL_URL_PORT={edge_port}",
                "TUNNEL_GATEWAY_SSH_HOST=127.0.0.1",
                f"TUNNEL_GATEWAY_SSH_PORT={ssh_port}",
                "",
            ]
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "REDIS_"))} | {
        "CI_BASE_IMAGE": built.stdout.strip(),
        "CI_TAG": project.removeprefix("cloudgpu-"),
        "CLOUDGPU_ENV_FILE": str(env_file),
        "POSTGRES_PASSWORD": secrets.token_urlsafe(16),
        "TUNNEL_GATEWAY_SECRET": secret,
        "HUB_HTTP_PORT": str(http_port),
        "GATEWAY_SSH_PORT": str(ssh_port),
        "GATEWAY_HTTP_PORT": str(edge_port),
    }
    compose = [
        compose_cli,
        "--project-name",
        project,
        "--file",
        str(REPO_ROOT / "docker-compose.yml"),
        "--file",
        str(REPO_ROOT / ".ci" / "compose" / "docker-compose.ci.yml"),
    ]
    stack = Stack(compose, env, url, edge_port)
    try:
        stack.run("up", "--detach", "--build", timeout=900)
        yield stack
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        logs = subprocess.run(
            [*compose, "logs", "--no-color"], cwd=REPO_ROOT, env=env, capture_output=True
        )
        (ARTIFACTS / f"{project}.log").write_bytes(logs.stdout + logs.stderr)
        subprocess.run(
            [*compose, "down", "--volumes", "--remove-orphans", "--timeout", "20"],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            timeout=300,
        )
        tag = env["CI_TAG"]
        images = [f"cloudgpu-ci/{name}:{tag}" for name in ("hub", "proxy", "gateway")]
        subprocess.run(["docker", "image", "rm", *images], capture_output=True, timeout=120)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _call_replica(stack: Stack, container: str, token: str, path: str, body: object) -> dict:
    request = json.dumps({"token": token, "path": path, "body": body})
    result = subprocess.run(
        ["docker", "exec", "-i", container, "python", "-c", _CALL_REPLICA],
        input=request,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return dict(json.loads(result.stdout))


def _replica_metrics(container: str) -> dict[str, float]:
    """A web replica's /metrics, asked from inside it (loopback may read it), unlabelled
    samples and ``registrations_ok``."""
    result = subprocess.run(
        ["docker", "exec", "-i", container, "python", "-c", _READ_METRICS],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    values: dict[str, float] = {}
    for line in result.stdout.splitlines():
        name, _, value = line.rpartition(" ")
        if name == 'cloudgpu_agent_registrations_total{outcome="ok"}':
            values["registrations_ok"] = float(value)
        elif name and "{" not in name and not name.startswith("#"):
            values[name] = float(value)
    return values


def _metric_writers(stack: Stack) -> set[str]:
    """The hostnames (containers) whose processes have files in the shared metrics folder."""
    names = stack.run("exec", "-T", "web", "ls", "/var/lib/cloudgpu-metrics").split()
    return {
        name.rsplit("_", 1)[1].removesuffix(".db").rsplit("-", 2)[0]
        for name in names
        if name.endswith(".db") and not name.endswith("_archive.db")
    }


def _hostname(container: str) -> str:
    return subprocess.run(
        ["docker", "inspect", "--format", "{{.Config.Hostname}}", container],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()


def _lease_state(renter: httpx.Client, lease_id: str, state: str) -> bool:
    return renter.get(f"/api/v1/leases/{lease_id}/").json()["state"] == state


def _url_up(renter: httpx.Client, lease_id: str) -> str | None:
    urls = renter.get(f"/api/v1/leases/{lease_id}/").json()["urls"]
    return urls[0]["url"] if urls and urls[0]["state"] == "up" else None


def _page_through_gateway(edge_port: int, url: str) -> str | None:
    """The URL's page as a browser gets it (*.localhost is this machine), None while it fails."""
    host = url.split("://", 1)[1].rstrip("/")
    try:
        page = httpx.get(f"http://127.0.0.1:{edge_port}/", headers={"Host": host}, timeout=10)
    except httpx.HTTPError:
        return None
    return page.text if page.status_code == 200 else None


def test_compose_runs_the_hub_and_a_rental_works_through_it(stack: Stack, tmp_path: Path) -> None:
    for service in SERVICES:
        assert stack.containers(service), f"no {service} container"
    webs = stack.containers("web")
    assert len(webs) == 2, "two web replicas"
    wait_for(lambda: _healthy(stack.url), timeout_s=120, what="/healthz through nginx")

    passwords = dict(_PASSWORD.findall(stack.manage("create_demo_accounts")))
    token = stack.manage(
        *("hub", "token", "create", "--owner", "supplier", "--name", "compose"),
        *("--default-price", "0"),
    ).strip()
    with httpx.Client(base_url=stack.url, timeout=30, follow_redirects=True) as renter:
        renter.get("/login/")
        renter.post(
            "/login/",
            data={
                "username": "renter",
                "password": passwords["renter"],
                "csrfmiddlewaretoken": renter.cookies["csrftoken"],
            },
            headers={"Referer": f"{stack.url}/login/"},
        )
        renter.headers.update({"X-CSRFToken": renter.cookies["csrftoken"], "Referer": stack.url})
        created = renter.post("/api/v1/tokens/", json={"name": "compose"})
        assert created.status_code == 201, created.text
        api_token = created.json()["token"]

        # A real agent on this machine, through nginx's WebSocket proxying.
        state = tmp_path / "agent"
        configured = configure(state, stack.url, token, "--runtime", "mock")
        assert configured.returncode == 0, configured.stderr
        with running_agent(state, tmp_path / "agent.log"):
            offer = wait_for(
                lambda: next(iter(renter.get("/api/v1/offers/").json()), None),
                timeout_s=90,
                what="the agent's GPU offered",
            )
            # Each replica starts one rental and stops the other's: whichever replica holds
            # the agent's socket, the other's commands cross the Channels layer in Redis.
            for starts, stops in ((webs[0], webs[1]), (webs[1], webs[0])):
                rented = _call_replica(
                    stack,
                    starts,
                    api_token,
                    "/api/v1/leases/",
                    {"gpu_ids": [offer["gpu_id"]], "image": "busybox", "ports": [8080]},
                )
                assert rented["status"] == 201, rented
                lease_id = rented["body"]["id"]
                wait_for(
                    lambda lease_id=lease_id: _lease_state(renter, lease_id, "running"),
                    timeout_s=90,
                    what=f"the lease started through {starts[:12]} running",
                )
                # Its port's URL answers through the gateway container (the agent's ssh -R).
                url = wait_for(
                    lambda lease_id=lease_id: _url_up(renter, lease_id),
                    timeout_s=90,
                    what="the rental's URL up",
                )
                page = wait_for(
                    lambda url=url: _page_through_gateway(stack.edge_port, url),
                    timeout_s=30,
                    what="the rental's page through the gateway",
                )
                assert lease_id in page
                stopped = _call_replica(
                    stack, stops, api_token, f"/api/v1/leases/{lease_id}/stop/", {}
                )
                assert stopped["status"] in {200, 202}, stopped
                wait_for(
                    lambda lease_id=lease_id: _lease_state(renter, lease_id, "ended"),
                    timeout_s=90,
                    what=f"the lease stopped through {stops[:12]} ended",
                )

            # Each replica's /metrics adds up every container's processes (the `metrics`
            # volume): the worker's telemetry flushes and billing runs, the agent's socket
            # and registration on whichever replica holds it.
            for web in webs:
                values = wait_for(
                    lambda web=web: (
                        v
                        if (v := _replica_metrics(web)).get("cloudgpu_billing_ticks_total", 0) > 0
                        and v.get("cloudgpu_telemetry_flush_seconds_count", 0) > 0
                        else None
                    ),
                    timeout_s=150,
                    what=f"the worker's flushes and billing runs in {web[:12]}'s /metrics",
                )
                assert values["cloudgpu_agents_connected"] == 1, values
                assert values["registrations_ok"] >= 1, values
            # Files from every web replica, the worker and beat, each under its container's
            # name (every one of them has pid 1 in its own container).
            hub_containers = [*webs, *stack.containers("worker"), *stack.containers("beat")]
            assert {_hostname(c) for c in hub_containers} <= _metric_writers(stack)

            # A restarted worker (same hostname, pid 1 again) adds to the counts: its
            # predecessor's files are folded into the archive, none are taken over or lost.
            before = _replica_metrics(webs[0])
            stack.run("restart", "worker", timeout=120)
            after = _replica_metrics(webs[1])
            for name in ("cloudgpu_billing_ticks_total", "cloudgpu_telemetry_flush_seconds_count"):
                assert after[name] >= before[name], (name, before, after)
            flushes = after["cloudgpu_telemetry_flush_seconds_count"]
            wait_for(
                lambda: _replica_metrics(webs[1])["cloudgpu_telemetry_flush_seconds_count"]
                > flushes,
                timeout_s=120,
                what="the restarted worker's flushes counted on top of the last one's",
            )
            archived = stack.run("exec", "-T", "web", "ls", "/var/lib/cloudgpu-metrics").split()
            assert "counter_archive.db" in archived, archived
