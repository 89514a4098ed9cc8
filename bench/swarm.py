"""Simulated agents: asyncio clients speaking the real protocol (register, heartbeats with one
GPU, like `--runtime mock`), many per process, spread over several processes.

One swarm process (``python -m bench.swarm ...``) runs its agents and takes commands as JSON
lines on stdin; it answers with JSON lines on stdout. ``Swarm`` below drives several of them.

Latency: after each heartbeat an agent sends a probe (a frame of an unknown type), whose error
reply the hub sends only after it has handled the heartbeat; the round trip is an upper bound on
heartbeat-to-processed, and includes the client's own scheduling.

Reconnects follow the real agent: full jitter, ``uniform(0, min(60, 1 * 2**attempt))``, and
its 10 s budgets to open the socket and to get the welcome.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import queue
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from supplier_agent.agent import BACKOFF_BASE_S, BACKOFF_CAP_S, STABLE_CONNECTION_S
from supplier_agent.hub_link import WELCOME_TIMEOUT_S

PROBE = json.dumps({"type": "probe", "v": 1})  # an unknown type: answered with an error


def _gpu(agent_id: str) -> dict[str, Any]:
    return {
        "index": 0, "uuid": f"GPU-{agent_id}", "name": "NVIDIA GeForce RTX 4090",
        "memory_total_bytes": 24 * 2**30, "memory_used_bytes": 0, "utilization_pct": 0,
        "processes": [],
    }  # fmt: skip


def register_frame(agent_id: str) -> str:
    return json.dumps({
        "type": "register", "v": 1, "agent_id": agent_id, "hostname": f"bench-{agent_id[:8]}",
        "os": "bench", "arch": "x86_64", "cpu_model": "bench", "cpu_count": 1, "ram_bytes": 0,
        "agent_version": "0.1.0", "runtime": "mock", "gpus": [_gpu(agent_id)], "claims": [],
    })  # fmt: skip


async def _await_probe_answer(ws: Any) -> None:
    """Read up to the probe's answer (an error: its type is unknown). The hub also sends
    frames of its own after a heartbeat (a round-trip ``ping`` 30 s after registering, then
    every 5 minutes): answered with ``pong`` as the real agent does, and not taken for the
    probe's answer. Taking them for it shifted every later reading of that agent by one
    frame, to the previous probe's answer already waiting: ~0.05 ms whatever the hub did."""
    while True:
        frame = json.loads(await ws.recv())
        if frame.get("type") == "ping":
            await ws.send(json.dumps({"type": "pong", "v": 1, "nonce": frame.get("nonce", "")}))
            continue
        if frame.get("type") == "error":
            return


def heartbeat_frame(agent_id: str) -> str:
    return json.dumps({"type": "heartbeat", "v": 1, "gpus": [_gpu(agent_id)], "claims": []})


@dataclass
class SwarmState:
    url: str
    tokens: list[str]  # agent ``index`` uses tokens[index % len(tokens)]
    agents: int
    interval: float
    probe: bool
    active: int
    gate: asyncio.Semaphore | None
    latencies: list[float] = field(default_factory=list)
    connected: set[int] = field(default_factory=set)
    ever_connected: set[int] = field(default_factory=set)
    drops: int = 0
    drop_codes: dict[str, int] = field(default_factory=dict)
    failed_connects: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    storm_at: float | None = None
    back: set[int] = field(default_factory=set)
    back_at: list[float] = field(default_factory=list)  # each agent's welcome after the storm
    all_back: asyncio.Event = field(default_factory=asyncio.Event)
    closing: bool = False
    reporter: asyncio.Task[None] | None = None


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


async def _session(index: int, agent_id: str, state: SwarmState) -> None:
    gate = state.gate if state.gate is not None else contextlib.nullcontext()
    # Several web processes: the URLs comma-separated, each agent always on the same one.
    urls = state.url.split(",")
    async with gate:
        ws = await connect(
            urls[index % len(urls)],
            additional_headers={
                "Authorization": f"Bearer {state.tokens[index % len(state.tokens)]}"
            },
            compression=None,
            # The real agent's budgets (10 s to open, 10 s for the welcome): in a storm an agent
            # that waits longer than that gives up and retries after its backoff.
            open_timeout=WELCOME_TIMEOUT_S,
            max_size=2**20,
            ping_interval=20,  # as the real agent
            ping_timeout=20,
            close_timeout=5,
        )
        try:
            await ws.send(register_frame(agent_id))
            welcome = json.loads(await asyncio.wait_for(ws.recv(), WELCOME_TIMEOUT_S))
        except BaseException:
            await ws.close()
            raise
    if welcome.get("type") != "welcome":
        await ws.close()
        raise OSError(f"no welcome: {welcome}")
    state.connected.add(index)
    state.ever_connected.add(index)
    if state.storm_at is not None:
        if index not in state.back:
            state.back_at.append(time.time())
        state.back.add(index)
        if len(state.back) == state.agents:
            state.all_back.set()
    heartbeat = heartbeat_frame(agent_id)
    try:
        async with ws:
            # Spread the agents over the interval, as real ones are.
            next_beat = time.monotonic() + random.uniform(0, state.interval)  # noqa: S311
            while True:
                await asyncio.sleep(max(0.0, next_beat - time.monotonic()))
                next_beat += state.interval
                if index >= state.active:
                    continue
                started = time.perf_counter()
                await ws.send(heartbeat)
                if state.probe:
                    await ws.send(PROBE)
                    await _await_probe_answer(ws)
                    state.latencies.append(time.perf_counter() - started)
                if next_beat < time.monotonic():
                    next_beat = time.monotonic()  # late: do not bunch up the missed ones
    except ConnectionClosed as exc:
        if not state.closing:
            state.drops += 1
            state.drop_codes[str(exc.rcvd.code if exc.rcvd else None)] = (
                state.drop_codes.get(str(exc.rcvd.code if exc.rcvd else None), 0) + 1
            )
        raise Dropped from exc
    finally:
        state.connected.discard(index)


class Dropped(Exception):
    """An established connection closed (counted in ``drops``)."""


async def _agent(index: int, state: SwarmState) -> None:
    agent_id = str(uuid.uuid4())
    attempt = 0
    while not state.closing:
        started = time.monotonic()
        try:
            await _session(index, agent_id, state)
        except Dropped:
            pass
        except (OSError, InvalidHandshake, ConnectionClosed, TimeoutError) as exc:
            if state.closing:
                return
            state.failed_connects += 1
            reason = f"{type(exc).__name__}: {str(exc)[:60]}"
            state.failure_reasons[reason] = state.failure_reasons.get(reason, 0) + 1
        if time.monotonic() - started > STABLE_CONNECTION_S:
            attempt = 0
        delay = random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt))  # noqa: S311
        attempt += 1
        await asyncio.sleep(delay)


async def _commands(state: SwarmState, tasks: list[asyncio.Task[None]]) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    me = psutil.Process()
    while True:
        line = await reader.readline()
        if not line:
            command: dict[str, Any] = {"cmd": "quit"}
        else:
            command = json.loads(line)
        name = command["cmd"]
        if name == "window":
            state.latencies.clear()
            drops, cpu = state.drops, me.cpu_times()
            started = time.monotonic()
            await asyncio.sleep(float(command["seconds"]))
            elapsed = time.monotonic() - started
            cpu_after = me.cpu_times()
            used = cpu_after.user + cpu_after.system - cpu.user - cpu.system
            emit({
                "event": "window", "latencies_ms": [round(x * 1000, 2) for x in state.latencies],
                "seconds": elapsed, "drops": state.drops - drops, "connected": len(state.connected),
                "drop_codes": state.drop_codes,
                "client_cpu_pct": round(100 * used / elapsed, 1),
            })  # fmt: skip
        elif name == "active":
            state.active = int(command["count"])
            emit({"event": "active", "count": state.active})
        elif name == "storm":
            # The hub is about to restart: count every agent back from now on, ungated, as
            # real agents (which do not coordinate) would come back.
            state.gate = None
            state.back.clear()
            state.back_at.clear()
            state.all_back.clear()
            state.storm_at = time.time()
            state.reporter = asyncio.create_task(_report_back(state))
            emit({"event": "storm"})
        elif name == "status":
            emit({"event": "status", "connected": len(state.connected), "drops": state.drops})
        elif name == "quit":
            state.closing = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            emit({"event": "bye"})
            return


async def _report_back(state: SwarmState) -> None:
    await state.all_back.wait()
    emit({
        "event": "all_back", "at": time.time(), "failed": state.failed_connects,
        "back_at": [round(t, 3) for t in state.back_at],
        "failure_reasons": dict(sorted(state.failure_reasons.items(), key=lambda kv: -kv[1])[:8]),
    })  # fmt: skip


async def _report_connected(state: SwarmState) -> None:
    started = time.monotonic()
    while len(state.ever_connected) < state.agents:
        await asyncio.sleep(1)
        emit({
            "event": "progress", "connected": len(state.connected),
            "seconds": round(time.monotonic() - started, 1), "failed": state.failed_connects,
        })  # fmt: skip
    emit({
        "event": "connected", "count": len(state.connected),
        "seconds": round(time.monotonic() - started, 2), "failed": state.failed_connects,
    })  # fmt: skip


def _tokens(env: Mapping[str, str], offset: int, agents: int) -> list[str]:
    """The shared token, or from ``CLOUDGPU_BENCH_TOKEN_FILE`` (one per line; secrets stay out
    of the processes' arguments) this process's ``agents`` starting at ``offset``."""
    path = env.get("CLOUDGPU_BENCH_TOKEN_FILE", "")
    if not path:
        return [env["CLOUDGPU_BENCH_TOKEN"]]
    with open(path) as file:
        every = file.read().split()
    if not every:
        raise SystemExit(f"{path} holds no tokens")
    return [every[(offset + n) % len(every)] for n in range(agents)]


async def run_swarm(args: argparse.Namespace) -> None:
    state = SwarmState(
        url=args.url,
        tokens=_tokens(os.environ, args.token_offset, args.agents),
        agents=args.agents,
        interval=args.interval,
        probe=not args.no_probe,
        active=args.agents,
        gate=asyncio.Semaphore(args.connect_concurrency),
    )
    tasks = [asyncio.create_task(_agent(i, state)) for i in range(args.agents)]
    reporter = asyncio.create_task(_report_connected(state))
    await _commands(state, tasks)
    reporter.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--agents", type=int, required=True)
    parser.add_argument("--interval", type=float, default=15.0)
    parser.add_argument("--connect-concurrency", type=int, default=8)
    parser.add_argument("--no-probe", action="store_true")
    parser.add_argument(
        "--token-offset", type=int, default=0, help="this process's first line of the token file"
    )
    asyncio.run(run_swarm(parser.parse_args()))


# --- the driver (in the bench script's process) -------------------------------------------------


class Swarm:
    """Several swarm processes; commands go to all, answers are merged."""

    def __init__(
        self,
        url: str,
        token: str,
        agents: int,
        *,
        procs: int | None = None,
        interval: float = 15.0,
        connect_concurrency: int = 8,
        per_process: int = 2500,
        token_file: Path | None = None,
    ) -> None:
        """``token`` is every agent's, unless ``token_file`` gives each agent its own line."""
        self.agents = agents
        procs = procs or max(1, math.ceil(agents / per_process))
        self.sizes = [agents // procs + (1 if i < agents % procs else 0) for i in range(procs)]
        self.events: queue.Queue[tuple[int, dict[str, Any]]] = queue.Queue()
        env = dict(os.environ, CLOUDGPU_BENCH_TOKEN=token, PYTHONUNBUFFERED="1")
        if token_file is not None:
            env["CLOUDGPU_BENCH_TOKEN_FILE"] = str(token_file)
        offsets = [sum(self.sizes[:n]) for n in range(procs)]
        self.processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.swarm",
                    "--url",
                    url,
                    "--agents",
                    str(size),
                    "--interval",
                    str(interval),
                    "--connect-concurrency",
                    str(connect_concurrency),
                    "--token-offset",
                    str(offset),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                text=True,
                cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            )
            for size, offset in zip(self.sizes, offsets, strict=True)
        ]
        for n, process in enumerate(self.processes):
            threading.Thread(target=self._read, args=(n, process), daemon=True).start()

    def _read(self, n: int, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            with contextlib.suppress(json.JSONDecodeError):
                self.events.put((n, json.loads(line)))
        self.events.put((n, {"event": "exit"}))

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def send(self, command: dict[str, Any]) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(json.dumps(command) + "\n")
            process.stdin.flush()

    def collect(self, event: str, timeout_s: float) -> dict[int, dict[str, Any]]:
        """One ``event`` from each process (fewer if the timeout passes)."""
        got: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout_s
        self.last_progress: dict[int, dict[str, Any]] = getattr(self, "last_progress", {})
        while len(got) < len(self.processes):
            try:
                n, message = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if message["event"] == event:
                got[n] = message
            elif message["event"] == "progress":
                self.last_progress[n] = message
            elif message["event"] == "exit":
                raise RuntimeError(f"swarm process {n} exited")
        return got

    def wait_connected(self, timeout_s: float) -> dict[str, Any]:
        got = self.collect("connected", timeout_s)
        if len(got) == len(self.processes):
            return {
                "connected": sum(m["count"] for m in got.values()),
                "seconds": max(m["seconds"] for m in got.values()),
                "failed_attempts": sum(m["failed"] for m in got.values()),
            }
        progress = {**self.last_progress, **got}
        return {
            "connected": sum(m.get("connected", m.get("count", 0)) for m in progress.values()),
            "seconds": timeout_s,
            "failed_attempts": sum(m["failed"] for m in progress.values()),
            "timed_out": True,
        }

    def window(self, seconds: float) -> dict[str, Any]:
        self.send({"cmd": "window", "seconds": seconds})
        got = self.collect("window", seconds + 120)
        latencies = [x for m in got.values() for x in m["latencies_ms"]]
        return {
            "latencies_ms": latencies,
            "seconds": max(m["seconds"] for m in got.values()),
            "drops": sum(m["drops"] for m in got.values()),
            "connected": sum(m["connected"] for m in got.values()),
            "client_cpu_pct": [m["client_cpu_pct"] for m in got.values()],
        }

    def set_active(self, total: int) -> None:
        remaining = total
        for n, (process, size) in enumerate(zip(self.processes, self.sizes, strict=True)):
            share = remaining if n == len(self.sizes) - 1 else round(total * size / self.agents)
            share = min(size, share)
            remaining -= share
            assert process.stdin is not None
            process.stdin.write(json.dumps({"cmd": "active", "count": share}) + "\n")
            process.stdin.flush()
        self.collect("active", 30)

    def storm(self) -> None:
        self.send({"cmd": "storm"})
        self.collect("storm", 30)

    def wait_all_back(self, timeout_s: float) -> dict[int, dict[str, Any]]:
        return self.collect("all_back", timeout_s)

    def status(self) -> dict[str, int]:
        self.send({"cmd": "status"})
        got = self.collect("status", 30)
        return {
            "connected": sum(m["connected"] for m in got.values()),
            "drops": sum(m["drops"] for m in got.values()),
        }

    def close(self) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            self.send({"cmd": "quit"})
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> Swarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    main()
