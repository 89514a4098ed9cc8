"""Tunnel throughput and added latency, each against direct loopback measured in the same run.

    python -m hub.runner exec --state .state/bench -- python -m bench.tunnel [--requests 2000]
    (or with DATABASE_URL and REDIS_URL set: python -m bench.tunnel)

Real parts only: the gateway (``hub.tunnels.gateway``: sshd + nginx), one Daphne answering the
edge's per-request route lookup, and the agent's own ``TunnelManager`` running ``ssh -R`` with
a lease key the hub registered from a docker_run ack. The origin is a local HTTP server standing
in for the container (no Docker, so the figure is the tunnel's, not the bridge's). Three paths:

- direct: client -> origin (the raw baseline, ``B_direct``)
- forward: client -> the gateway's loopback listen port -> sshd -> ssh -> origin (the tunnel)
- edge: client -> nginx (+ route lookup at the hub) -> forward (what a renter's browser gets)

Needs root (sshd), openssh-server and nginx. One client, keep-alive, sequential requests: the
latency a single user sees; throughput is one stream of ``--mib`` MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench import common
from bench.common import (
    LOG_DIR,
    REPO,
    Hub,
    bench_env,
    free_port,
    machine,
    median,
    prepare,
    setup_django,
    stop_tree,
    summary,
    wait_for_port,
    write_result,
)

DOMAIN = "tunnels.bench"
CHUNK = b"x" * (1 << 20)


class Origin(BaseHTTPRequestHandler):
    """The stand-in container: /small answers 2 bytes, /big?mib=N streams N MiB."""

    protocol_version = "HTTP/1.1"
    # Headers and body are two writes: with Nagle on, each answer waits for a delayed ACK.
    disable_nagle_algorithm = True

    def do_GET(self) -> None:
        if self.path.startswith("/big"):
            mib = int(self.path.rsplit("=", 1)[-1])
            self.send_response(200)
            self.send_header("Content-Length", str(mib * len(CHUNK)))
            self.end_headers()
            for _ in range(mib):
                self.wfile.write(CHUNK)
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        return


@dataclass(frozen=True)
class Path_:
    port: int
    host: str
    fresh: bool = False  # a new connection for every request (what nginx does upstream)
    path: str = "/small"
    headers: tuple[tuple[str, str], ...] = ()
    status: int = 200


def _latencies(target: Path_, requests: int) -> list[float]:
    """Sequential GETs on one keep-alive connection, or on a new connection each."""
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=30)
    headers = {"Host": target.host, **dict(target.headers)}
    out = []
    try:
        for _ in range(20):  # warm the connection and the hub's route lookup
            conn.request("GET", target.path, headers=headers)
            conn.getresponse().read()
        for _ in range(requests):
            if target.fresh:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=30)
            started = time.perf_counter()
            conn.request("GET", target.path, headers=headers)
            response = conn.getresponse()
            response.read()
            out.append((time.perf_counter() - started) * 1000)
            if response.status != target.status:
                raise RuntimeError(f"bad answer from {target}: {response.status}")
    finally:
        conn.close()
    return out


def _throughput(port: int, host: str, mib: int) -> float:
    """MiB/s of one download of ``mib`` MiB."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        started = time.perf_counter()
        conn.request("GET", f"/big?mib={mib}", headers={"Host": host})
        response = conn.getresponse()
        received = 0
        while chunk := response.read(1 << 20):
            received += len(chunk)
        elapsed = time.perf_counter() - started
    finally:
        conn.close()
    if received != mib * len(CHUNK):
        raise RuntimeError(f"short download on port {port}: {received} bytes")
    return mib / elapsed


class AgentSide:
    """The agent's TunnelManager on its own event loop thread."""

    def __init__(self, state_dir: Path) -> None:
        from supplier_agent.tunnels import TunnelManager

        self.loop = asyncio.new_event_loop()
        self.up = threading.Event()
        self.manager = TunnelManager(state_dir, self._report)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def _report(self, message: Any) -> None:
        if message.state == "up":
            self.up.set()

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def close(self) -> None:
        self.call(self.manager.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def _lease_with_tunnel(agent: AgentSide, container_port: int) -> tuple[Any, Any, str]:
    """Host, lease and key through the hub's own services, as the control plane makes them."""
    from hub.accounts.models import User
    from hub.agents import registration
    from hub.leases import services as lease_services
    from hub.leases.models import Command
    from hub.suppliers import services as supplier_services
    from supplier_agent.protocol import Ack, GpuState, Register

    supplier = User.objects.create_user(f"bench-supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(f"bench-renter-{uuid.uuid4().hex[:6]}")
    token, _ = supplier_services.create_agent_token(supplier, "bench")
    gpu = GpuState(
        index=0, uuid=f"GPU-{uuid.uuid4()}", name="bench GPU", memory_total_bytes=1 << 34,
        memory_used_bytes=0, utilization_pct=0, processes=(),
    )  # fmt: skip
    register = Register(
        agent_id=str(uuid.uuid4()), hostname="bench", os="linux", arch="x86_64",
        cpu_model="bench", cpu_count=1, ram_bytes=1 << 30, agent_version="bench",
        runtime="mock", gpus=(gpu,),
    )  # fmt: skip
    registered = registration.register_host(token.pk, register, "")
    from hub.suppliers.models import Host

    host = Host.objects.get(pk=registered.host_id)
    spec = lease_services.LeaseSpec(image="bench", ports=[container_port])
    lease = lease_services.start_lease(renter, host, [0], spec)

    def answer(kind: str, result: dict[str, Any]) -> None:
        command = Command.objects.filter(lease=lease, kind=kind).latest("created_at")
        lease_services.record_ack(host.pk, Ack(command_id=str(command.id), ok=True, result=result))

    answer(Command.Kind.RESERVE, {"gpu_indices": [0]})
    public_key = agent.call(agent.manager.ensure_key(str(lease.pk)))
    answer(
        Command.Kind.DOCKER_RUN,
        {
            "container_id": "bench",
            "ports": {str(container_port): 0},
            "tunnel_public_key": public_key,
        },
    )
    lease.refresh_from_db()
    run = Command.objects.filter(lease=lease, kind=Command.Kind.DOCKER_RUN).latest("created_at")
    return host, lease, run.payload["tunnel"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per path and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=256, help="download size for throughput")
    args = parser.parse_args()
    if os.geteuid() != 0 or not Path("/usr/sbin/sshd").exists() or not shutil.which("nginx"):
        print("bench.tunnel needs root, openssh-server and nginx", file=sys.stderr)
        return 2

    # A scratch database of its own, so that it can run beside the other scripts.
    common.BENCH_DATABASE = f"{common.BENCH_DATABASE}_tunnel"
    folder_parent = Path(tempfile.mkdtemp(prefix="cloudgpu-bench-gw-", dir="/run"))
    folder_parent.chmod(0o755)
    folder = folder_parent / "gateway"
    secret = secrets.token_urlsafe(32)
    ssh_port, http_port = free_port(), free_port()
    env = bench_env(
        TUNNEL_DOMAIN=DOMAIN,
        TUNNEL_URL_SCHEME="http",
        TUNNEL_GATEWAY_SSH_HOST="127.0.0.1",
        TUNNEL_GATEWAY_SSH_PORT=str(ssh_port),
        TUNNEL_GATEWAY_HOST_KEYS_FILE=str(folder / "ssh_host_ed25519_key.pub"),
        TUNNEL_GATEWAY_SECRET=secret,
    )
    prepare(env)
    origin = ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    origin_port = origin.server_address[1]
    threading.Thread(target=origin.serve_forever, daemon=True).start()
    gateway: subprocess.Popen[bytes] | None = None
    agent: AgentSide | None = None
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    try:
        with Hub(env) as hub, open(LOG_DIR / "gateway.log", "ab") as gateway_log:
            hub.start_web()
            gateway = subprocess.Popen(
                [sys.executable, "-m", "hub.tunnels.gateway", "run", "--folder", str(folder),
                 "--hub-url", hub.http_url, "--ssh-listen", f"127.0.0.1:{ssh_port}",
                 "--http-listen", f"127.0.0.1:{http_port}", "--nginx-workers", "1"],
                cwd=REPO, env=env, stdout=gateway_log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            for port in (ssh_port, http_port):
                if not wait_for_port(port, timeout_s=30):
                    raise RuntimeError(f"the gateway did not listen; see {LOG_DIR}/gateway.log")
            for key in [k for k in env if k.startswith("TUNNEL_")]:
                os.environ[key] = env[key]
            setup_django(env)
            from hub.tunnels import services as tunnel_services
            from hub.tunnels.models import Tunnel
            from supplier_agent.protocol import TunnelSpec, TunnelState

            agent = AgentSide(folder_parent / "agent")
            container_port = 8080
            host, lease, spec = _lease_with_tunnel(agent, container_port)
            agent.call(
                agent.manager.start(
                    str(lease.pk),
                    TunnelSpec.parse(spec, "tunnel"),
                    {str(container_port): origin_port},
                )
            )
            if not agent.up.wait(timeout=60):
                raise RuntimeError("the tunnel did not come up")
            tunnel_services.record_state(
                host.pk, TunnelState(lease_id=str(lease.pk), port=container_port, state="up")
            )
            tunnel = Tunnel.objects.get(lease=lease)
            edge_host = f"{tunnel.public_id}-i.{DOMAIN}"
            lookup = (
                ("X-CloudGPU-Gateway-Secret", secret),
                ("X-CloudGPU-Tunnel-Host", edge_host),
            )
            paths = {
                "direct": Path_(origin_port, "127.0.0.1"),
                "forward": Path_(tunnel.listen_port, "127.0.0.1"),
                # What the edge does: a new connection (a new ssh channel) per request.
                "forward_new_conn": Path_(tunnel.listen_port, "127.0.0.1", fresh=True),
                "direct_new_conn": Path_(origin_port, "127.0.0.1", fresh=True),
                # The edge's per-request question to the hub, asked directly.
                "hub_route_lookup": Path_(
                    hub.port,
                    "127.0.0.1",
                    path="/internal/tunnels/edge/auth",
                    headers=lookup,
                    status=204,
                ),
                "edge": Path_(http_port, edge_host),
            }
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
            for _ in range(args.rounds):
                for name, target in paths.items():
                    latencies = _latencies(target, args.requests)
                    row: dict[str, Any] = {"latency_ms": summary(latencies, 3)}
                    if target.path == "/small":
                        row["throughput_mib_s"] = round(
                            _throughput(target.port, target.host, args.mib), 1
                        )
                    rounds[name].append(row)
    finally:
        if agent is not None:
            agent.close()
        if gateway is not None:
            stop_tree(gateway)
        origin.shutdown()
        shutil.rmtree(folder_parent, ignore_errors=True)

    figures: dict[str, Any] = {}
    for name, runs in rounds.items():
        figures[name] = {
            "latency_p50_ms": round(median([r["latency_ms"]["p50"] for r in runs]), 3),
            "latency_p99_ms": round(median([r["latency_ms"]["p99"] for r in runs]), 3),
            "throughput_mib_s": round(
                median([r.get("throughput_mib_s", float("nan")) for r in runs]), 1
            ),
            "rounds": runs,
        }
    direct = figures["direct"]
    for name in ("forward", "forward_new_conn", "edge"):
        fig = figures[name]
        fig["added_p50_ms"] = round(fig["latency_p50_ms"] - direct["latency_p50_ms"], 3)
        fig["added_p99_ms"] = round(fig["latency_p99_ms"] - direct["latency_p99_ms"], 3)
        fig["throughput_ratio_to_direct"] = round(
            fig["throughput_mib_s"] / direct["throughput_mib_s"], 3
        )
    result = {
        "machine": machine(),
        "requests_per_round": args.requests,
        "rounds": args.rounds,
        "download_mib": args.mib,
        "figures": figures,
    }
    path = write_result("tunnel", result)
    print(f"{'path':16} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'MiB/s':>8} {'x direct':>9}")
    for name, fig in figures.items():
        print(
            f"{name:16} {fig['latency_p50_ms']:8.3f} {fig['latency_p99_ms']:8.3f} "
            f"{fig.get('added_p50_ms', 0):8.3f} {fig['throughput_mib_s']:8.1f} "
            f"{fig.get('throughput_ratio_to_direct', 1):9.3f}"
        )
    print(f"raw results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
