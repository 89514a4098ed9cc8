"""Dispatch latency and rent-to-running (issue 8).

    python -m bench.dispatch mock --leases 30     # dispatch + rent to running, mock runtime
    python -m bench.dispatch docker --leases 10   # rent to running with a real container

``mock``:
- *dispatch*: renter action (``start_lease`` / ``release_lease``, the services the dashboard
  calls, run in this process) to the command frame received by a simulated agent (a websocket
  client in a thread of this process, so both ends read one clock). The agent acks at once.
  Goal: p50 <= B_celery + 3 x B_rtt + 20 ms, p99 <= 250 ms.
- *rent to running*: a real ``cloudgpu-agent run --runtime mock``; ``running_since -
  created_at`` of each lease (the hub's clock), one lease at a time, released in between.

``docker``: the same with ``--runtime docker`` (fake NVML, one GPU, ``--gpu-devices none``) and
a busybox httpd container built locally; the agent acks once the port answers. Goal: p50 <=
B_docker + 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from bench import common
from bench.swarm import heartbeat_frame, register_frame

WARMUP = 2
HTTPD = "mkdir -p /www; echo ok > /www/index.html; exec httpd -f -p 8080 -h /www"


class SimulatedAgent(threading.Thread):
    """Registers, records when each command frame arrives, acks it at once."""

    def __init__(self, url: str, token: str, agent_id: str) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.agent_id = url, token, agent_id
        self.received: dict[tuple[str, str], float] = {}
        self.arrived = threading.Condition()
        self.welcomed = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        from supplier_agent.protocol import Ack, encode

        with connect(self.url, additional_headers={"Authorization": f"Bearer {self.token}"}) as ws:
            ws.send(register_frame(self.agent_id))
            json.loads(ws.recv(timeout=60))
            self.welcomed.set()
            next_beat = time.monotonic() + 10
            while not self.stop.is_set():
                if time.monotonic() > next_beat:
                    ws.send(heartbeat_frame(self.agent_id))
                    next_beat = time.monotonic() + 10
                try:
                    frame = json.loads(ws.recv(timeout=0.5))
                except TimeoutError:
                    continue
                now = time.perf_counter()
                kind = frame.get("type")
                if kind not in ("reserve", "docker_run", "release"):
                    continue
                with self.arrived:
                    self.received[(frame["lease_id"], kind)] = now
                    self.arrived.notify_all()
                result: dict[str, Any] = {"warnings": []}
                if kind == "reserve":
                    result["gpu_indices"] = [0]
                elif kind == "docker_run":
                    result = {"container_id": f"sim-{frame['lease_id']}", "ports": {}}
                ws.send(encode(Ack(command_id=frame["command_id"], ok=True, result=result)))

    def wait_for(self, lease_id: str, kind: str, timeout_s: float = 30) -> float:
        with self.arrived:
            self.arrived.wait_for(lambda: (lease_id, kind) in self.received, timeout_s)
            return self.received[(lease_id, kind)]


def _wait_state(lease_id: Any, states: tuple[str, ...], timeout_s: float = 120) -> Any:
    from hub.leases.models import Lease

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lease = Lease.objects.get(pk=lease_id)
        if lease.state in states:
            return lease
        time.sleep(0.01)
    raise TimeoutError(f"lease {lease_id} not in {states} after {timeout_s} s")


def _wait_online(owner: Any, timeout_s: float = 60) -> Any:
    from hub.suppliers.models import Host

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        host = Host.objects.filter(owner=owner, status="online").first()
        if host is not None:
            return host
        time.sleep(0.1)
    raise TimeoutError("no host came online")


def _people(env: dict[str, str], name: str) -> tuple[Any, Any, str]:
    from hub.accounts.models import User
    from hub.suppliers.services import create_agent_token

    supplier = User.objects.create_user(f"{name}-supplier")
    renter = User.objects.create_user(f"{name}-renter")
    # Its hosts' GPUs are listed at $0 when they first report (otherwise unlisted until priced).
    _, token = create_agent_token(supplier, default_price_per_hour_micros=0)
    return supplier, renter, token


def _rent_to_running(
    renter: Any, host: Any, spec: Any, leases: int, on_running: Callable[[Any], None] | None = None
) -> list[float]:
    from hub.leases.services import release_lease, start_lease

    samples = []
    for n in range(leases + WARMUP):
        lease = start_lease(renter, host, [0], spec)
        lease = _wait_state(lease.pk, ("running", "failed", "ended"))
        if lease.state != "running":
            raise RuntimeError(f"lease {lease.pk} {lease.state}: {lease.failure_reason}")
        if n >= WARMUP:
            samples.append((lease.running_since - lease.created_at).total_seconds())
        if on_running is not None:
            on_running(lease)
        release_lease(lease.pk)
        _wait_state(lease.pk, ("ended",))
    return samples


def _start_agent(
    hub: common.Hub, token: str, state: Path, args: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    configure = subprocess.run(
        [common.AGENT, "configure", "--state", str(state), "--hub", hub.http_url, *args],
        input=token + "\n", capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if configure.returncode != 0:
        raise RuntimeError(configure.stderr)
    log = open(common.LOG_DIR / "agent.log", "ab")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [common.AGENT, "run", "--state", str(state), "--log-level", "WARNING"],
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def start_docker_agent(hub: common.Hub, token: str, folder: Path) -> subprocess.Popen[bytes]:
    """A real agent with the Docker runtime and one fake GPU (fake NVML, no device passed to
    containers), its state in ``folder``."""
    from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env

    table = FakeGpuTable.create(folder / "gpus.json", gpu_count=1)
    (folder / "locks").mkdir()
    return _start_agent(
        hub,
        token,
        folder / "agent",
        # No registry here: the benchmark's image is built on this machine.
        ["--gpu-devices", "none", "--lock-dir", str(folder / "locks"), "--allow-local-images"],
        agent_env(**fake_nvml_env(table.path)),
    )


def agent_env(**extra: str) -> dict[str, str]:
    """An agent gets none of the hub's settings or secrets."""
    import os

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_", "REDIS_", "SECRET_", "CLOUDGPU_"))
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def mock(args: argparse.Namespace) -> dict[str, Any]:
    import uuid

    env = common.bench_env()
    common.prepare(env)
    result: dict[str, Any] = {"figure": "dispatch (mock)", "machine": common.machine()}
    b_rtt = common.baseline_rtt(env["REDIS_URL"])
    b_celery = common.baseline_celery(env)
    result["baselines"] = {
        "B_rtt_ms": common.ms(b_rtt),
        "B_celery_p50_ms": common.ms(b_celery["p50"]),
        "B_celery_p99_ms": common.ms(b_celery["p99"]),
        "B_pg1_updates_per_s": round(common.baseline_pg1(env["DATABASE_URL"])),
    }
    common.setup_django(env)
    from hub.leases.services import LeaseSpec, release_lease, start_lease

    spec = LeaseSpec(image="busybox", ports=[8080])
    with common.Hub(env).start() as hub:
        supplier, renter, token = _people(env, "dispatch")
        agent = SimulatedAgent(hub.ws_url, token, str(uuid.uuid4()))
        agent.start()
        agent.welcomed.wait(60)
        host = _wait_online(supplier)
        reserve: list[float] = []
        release: list[float] = []
        next_step: list[float] = []
        # The rent's own transaction (start_lease, in this process): the part of "dispatch"
        # before the command is committed and handed to Celery.
        in_service: list[float] = []
        # Two warm-up leases first (the worker's first task imports and connects).
        for n in range(args.leases + WARMUP):
            started = time.perf_counter()
            lease = start_lease(renter, host, [0], spec)
            in_service.append(time.perf_counter() - started)
            lease_id = str(lease.pk)
            reserve.append(agent.wait_for(lease_id, "reserve") - started)
            # ack of reserve -> docker_run: the hub's own step, also through Celery.
            next_step.append(
                agent.wait_for(lease_id, "docker_run") - agent.wait_for(lease_id, "reserve")
            )
            _wait_state(lease.pk, ("running",))
            started = time.perf_counter()
            release_lease(lease.pk)
            release.append(agent.wait_for(lease_id, "release") - started)
            _wait_state(lease.pk, ("ended",))
            if n < WARMUP:
                del reserve[-1], release[-1], next_step[-1], in_service[-1]
            time.sleep(0.05)
        agent.stop.set()
        agent.join(10)
        with tempfile.TemporaryDirectory(prefix="cloudgpu-bench-agent-") as folder:
            supplier2, _, token2 = _people(env, "mockagent")
            process = _start_agent(hub, token2, Path(folder), ["--runtime", "mock"], agent_env())
            try:
                host2 = _wait_online(supplier2)
                rent = _rent_to_running(renter, host2, spec, args.leases)
            finally:
                common.stop_tree(process)
    dispatch = [x * 1000 for x in reserve + release]
    goal_p50 = b_celery["p50"] * 1000 + 3 * b_rtt * 1000 + 20
    result.update(
        leases=args.leases,
        dispatch_ms=common.summary(dispatch),
        dispatch_reserve_ms=common.summary([x * 1000 for x in reserve]),
        dispatch_release_ms=common.summary([x * 1000 for x in release]),
        ack_to_next_command_ms=common.summary([x * 1000 for x in next_step]),
        dispatch_goal_p50_ms=round(goal_p50, 2),
        rent_to_running_mock_ms=common.summary([x * 1000 for x in rent]),
        start_lease_ms=common.summary([x * 1000 for x in in_service]),
    )
    return result


def docker(args: argparse.Namespace) -> dict[str, Any]:
    env = common.bench_env()
    common.prepare(env)
    result: dict[str, Any] = {"figure": "rent to running (docker)", "machine": common.machine()}
    image = common.build_busybox_image()
    b_docker = common.baseline_docker(image)
    result["baselines"] = {
        "B_docker_p50_ms": common.ms(b_docker["p50"]),
        "B_docker_p99_ms": common.ms(b_docker["p99"]),
        "B_celery_p50_ms": common.ms(common.baseline_celery(env)["p50"]),
        "B_rtt_ms": common.ms(common.baseline_rtt(env["REDIS_URL"])),
    }
    common.setup_django(env)
    from hub.leases.services import LeaseSpec

    spec = LeaseSpec(image=image, ports=[8080], command=["sh", "-c", HTTPD])
    with (
        common.Hub(env).start() as hub,
        tempfile.TemporaryDirectory(prefix="cloudgpu-bench-docker-") as folder,
    ):
        supplier, renter, token = _people(env, "docker")
        process = start_docker_agent(hub, token, Path(folder))
        try:
            host = _wait_online(supplier)
            rent = _rent_to_running(renter, host, spec, args.leases)
        finally:
            common.stop_tree(process)
    result.update(
        leases=args.leases,
        rent_to_running_docker_ms=common.summary([x * 1000 for x in rent]),
        goal_p50_ms=round(b_docker["p50"] * 1000 + 500, 1),
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runtime", choices=["mock", "docker"])
    parser.add_argument("--leases", type=int, default=30)
    args = parser.parse_args()
    if args.runtime == "mock":
        common.write_result("dispatch-mock", mock(args))
    else:
        common.write_result("dispatch-docker", docker(args))


if __name__ == "__main__":
    main()
