"""Keystroke to echo in a renter's terminal (issue 17).

    python -m bench.terminal --keys 300

A real hub (Daphne, worker, beat), a real agent with the Docker runtime (fake NVML, no device)
and a busybox lease. The bench opens the API's terminal socket (the lease page's protocol with a
bearer token), types one character at a time at the shell's prompt and times each until its
echo comes back: client -> Daphne -> channel layer -> the agent's socket -> agent -> `docker
exec` pty -> and all the way back.

Baselines, same run:
- *B_agent_rtt*, the WebSocket round trip to the agent: the terminal socket's own ``ping``,
  which goes client -> Daphne -> the agent's socket -> the agent's receive loop, is answered
  there and comes back the same way; the keystroke's path without the container. One ping
  just before each key, so the two figures see the same moment's load.
- *B_ws_ping*, a protocol-level WebSocket ping/pong between this client and Daphne (one hop of
  the path, answered below the application).
- *B_exec*, the same keystroke echo through `docker exec` straight from this process (the
  container's floor, no hub).

The goal (issue 17): echo p50 within 2x the WebSocket round trip to the agent, 2 x B_agent_rtt.
A stricter reading, 2 x (client<->hub + hub<->agent) at the protocol level (4 x B_ws_ping) plus
B_exec, is reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from websockets.sync.client import connect

from bench import common
from bench.dispatch import _people, _wait_online, _wait_state, start_docker_agent

WARMUP_KEYS = 20


def _echo_times(
    send: Any, read_until: Any, keys: int, ping: Any = None, gap_s: float = 0.0
) -> tuple[list[float], list[float]]:
    """Type 'x' and erase it (a backspace echoes as "\\b \\b"), timing each echo; with
    ``ping``, a round trip to the agent before each key, so both see the same load. Each
    ping and key comes ``gap_s`` after the last answer, at a typist's pace: with none, the
    processes on the path never go idle, as they do between a person's keystrokes."""
    samples, rtts = [], []
    for n in range(keys + WARMUP_KEYS):
        time.sleep(gap_s)  # the workload's pace, not a wait for anything
        rtt = ping(n) if ping is not None else 0.0
        time.sleep(gap_s)
        started = time.perf_counter()
        send("x")
        read_until("x")
        took = time.perf_counter() - started
        send("\x7f")
        read_until("\b")
        if n >= WARMUP_KEYS:
            samples.append(took)
            rtts.append(rtt)
    return samples, rtts


def read_until_prompt(ws: Any) -> None:
    text = ""
    while "#" not in text:
        message = json.loads(ws.recv(timeout=10))
        if message["type"] != "output":
            raise RuntimeError(f"the session ended: {message}")
        text += message["data"]


def agent_round_trip(ws: Any, n: int) -> float:
    """The terminal socket's ping: to the host's agent and back (nothing else is in flight)."""
    nonce = f"b{n}"
    started = time.perf_counter()
    ws.send(json.dumps({"type": "ping", "nonce": nonce}))
    while True:
        message = json.loads(ws.recv(timeout=10))
        if message["type"] == "pong" and message["nonce"] == nonce:
            return time.perf_counter() - started
        if message["type"] == "exit":
            raise RuntimeError(f"the session ended: {message}")


def direct_exec(container_id: str, keys: int) -> list[float]:
    import docker

    from supplier_agent.docker_exec import open_exec

    client = docker.from_env()
    process = open_exec(client.api, container_id, None, tty=True, cols=80, rows=24)
    buffer = b""

    def read_until(text: str) -> None:
        nonlocal buffer
        while text.encode() not in buffer:
            buffer += process.read(4096)
        buffer = buffer[buffer.index(text.encode()) + 1 :]

    time.sleep(0.5)  # let the prompt print before the first key (a bench, not a test)
    process.read(4096)
    try:
        return _echo_times(lambda k: process.write(k.encode()), read_until, keys)[0]
    finally:
        process.close()
        client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument(
        "--gap-ms", type=float, default=50.0, help="pause before each key and ping (typing pace)"
    )
    args = parser.parse_args()

    env = common.bench_env()
    common.prepare(env)
    result: dict[str, Any] = {"figure": "terminal keystroke to echo", "machine": common.machine()}
    image = common.build_busybox_image()
    common.setup_django(env)
    from hub.accounts.api_tokens import create_api_token
    from hub.leases.models import Lease
    from hub.leases.services import LeaseSpec, release_lease, start_lease

    spec = LeaseSpec(image=image, ports=[], command=["sleep", "3600"])
    with (
        common.Hub(env).start() as hub,
        tempfile.TemporaryDirectory(prefix="cloudgpu-bench-terminal-") as folder,
    ):
        supplier, renter, token = _people(env, "terminal")
        process = start_docker_agent(hub, token, Path(folder))
        try:
            host = _wait_online(supplier)
            lease = start_lease(renter, host, [0], spec)
            lease = _wait_state(lease.pk, ("running", "failed"))
            if lease.state != Lease.State.RUNNING:
                raise RuntimeError(f"lease {lease.state}: {lease.failure_reason}")
            _, api_token = create_api_token(renter, "bench", ["read", "leases"])
            url = hub.ws_url.replace("/api/p2p/ws/", f"/api/v1/leases/{lease.pk}/terminal/")
            with connect(url, additional_headers={"Authorization": f"Bearer {api_token}"}) as ws:
                pings = []
                for _ in range(200):
                    started = time.perf_counter()
                    ws.ping().wait(10)
                    pings.append(time.perf_counter() - started)
                buffer = ""
                read_until_prompt(ws)

                def read_until(text: str) -> None:
                    nonlocal buffer
                    while text not in buffer:
                        message = json.loads(ws.recv(timeout=10))
                        if message["type"] != "output":
                            raise RuntimeError(f"the session ended: {message}")
                        buffer += message["data"]
                    buffer = buffer[buffer.index(text) + 1 :]

                def send(key: str) -> None:
                    ws.send(json.dumps({"type": "input", "data": key}))

                echoes, agent_rtts = _echo_times(
                    send,
                    read_until,
                    args.keys,
                    lambda n: agent_round_trip(ws, n),
                    gap_s=args.gap_ms / 1000,
                )
            direct = direct_exec(lease.container_id, args.keys)
            release_lease(lease.pk)
            _wait_state(lease.pk, ("ended",))
        finally:
            common.stop_tree(process)
    b_ping = common.median(pings)
    b_exec = common.median(direct)
    b_agent = common.median(agent_rtts)
    result.update(
        keys=args.keys,
        gap_ms=args.gap_ms,
        baselines={
            "B_agent_rtt_ms": common.summary([x * 1000 for x in agent_rtts]),
            "B_ws_ping_ms": common.summary([x * 1000 for x in pings]),
            "B_exec_ms": common.summary([x * 1000 for x in direct]),
        },
        echo_ms=common.summary([x * 1000 for x in echoes]),
        goal_p50_ms=round(2 * b_agent * 1000, 2),
        strict_goal_p50_ms=round((4 * b_ping + b_exec) * 1000, 2),
        load_average=list(os.getloadavg()),
    )
    common.write_result("terminal", result)


if __name__ == "__main__":
    main()
