"""What the agent protocol's parser and encoder cost per frame (issue 15 item 3).

    python -m bench.protocol_parse                     # supplier_agent.protocol, 7 rounds
    python -m bench.protocol_parse --module supplier_agent.protocol --module other.protocol

Frames/s of ``parse_message`` for a realistic heartbeat (8 GPUs with 3 processes each, 4
claims of 2 GPUs with their ports and container pids: the hub's hot path, one per host every
15 s) and for a docker_run with every optional field (the agent's side), and messages/s of
``encode`` for both. Raw baselines in the same run: ``json.loads`` and ``json.dumps`` of the
same frames, which no parser built on the standard library's JSON can beat.

Pure CPU in one process: no database, Redis or hub processes. Each figure is the median of
``--rounds`` windows of ``--window`` seconds, the rounds interleaved across figures and modules
so that a noisy neighbour slows all of them alike. Several ``--module``s (any module with
``parse_message``, ``encode``, ``AGENT_TO_HUB`` and ``HUB_TO_AGENT``) are compared in one run.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import statistics
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

from bench import common

GPUS = 8
PROCESSES_PER_GPU = 3
CLAIMS = 4
LEASE_IDS = [f"{n:08x}-1111-4222-8333-{n:012x}" for n in range(1, CLAIMS + 1)]


def heartbeat_frame() -> str:
    """A busy 8-GPU host: every GPU rented (two per claim), a few processes on each."""
    gpus = []
    for index in range(GPUS):
        claim = index // 2
        gpus.append(
            {
                "index": index,
                "uuid": f"GPU-{index:08x}-aaaa-4bbb-8ccc-{index:012x}",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_total_bytes": 85_520_809_984,
                "memory_used_bytes": 61_203_283_968 + index * 1_048_576,
                "utilization_pct": 87,
                "processes": [
                    {
                        "pid": 40_000 + claim * 100 + n,
                        "name": "/opt/conda/bin/python3",
                        "memory_bytes": 20_401_094_656,
                    }
                    for n in range(PROCESSES_PER_GPU)
                ],
            }
        )
    claims = [
        {
            "lease_id": lease_id,
            "gpu_indices": [2 * n, 2 * n + 1],
            "epoch": 1_000 + n,
            "container_id": f"{n:064x}",
            "ports": {"8888": 41_000 + 2 * n, "6006": 41_001 + 2 * n},
            "pids": [40_000 + n * 100 + p for p in range(6)],
        }
        for n, lease_id in enumerate(LEASE_IDS)
    ]
    return json.dumps({"type": "heartbeat", "v": 1, "gpus": gpus, "claims": claims})


def docker_run_frame() -> str:
    """A docker_run with every optional field, as the hub sends a tunnelled, priced rental."""
    key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHVic2lkZWNvbW1hbmR0ZXN0a2V5Zm9yaHVi"
    return json.dumps(
        {
            "type": "docker_run",
            "v": 1,
            "command_id": "9b2f4c1e-5d6a-4e7f-8a9b-0c1d2e3f4a5b",
            "lease_id": LEASE_IDS[0],
            "epoch": 1_000,
            "image": "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
            "ports": [8888, 6006, 8080, 22],
            "env": {f"VAR_{n}": f"value number {n}" for n in range(10)},
            "entrypoint": ["/bin/bash", "-lc"],
            "command": ["jupyter lab --ip=0.0.0.0 --port=8888 --no-browser --allow-root"],
            "user": "1000:1000",
            "cache_volume": {"name": "renter-" + "c" * 40, "path": "/root/.cache/huggingface"},
            "warmup": ["python", "-c", "import torch; torch.cuda.init()"],
            "paid_until": "2026-12-01T12:00:00.000000+00:00",
            "tunnel": {
                "host": "gw.example.net",
                "port": 2222,
                "user": "tunnel",
                "host_keys": [key],
                "forwards": [
                    {"port": 8888, "listen_port": 20_001},
                    {"port": 6006, "listen_port": 20_002},
                ],
            },
            "volumes": [
                {"name": "vol-" + "a" * 40, "path": "/data", "size_bytes": 10 * 2**30},
                {"name": "vol-" + "b" * 40, "path": "/models", "size_bytes": None},
            ],
        }
    )


def rate(call: Callable[[], Any], window_s: float) -> float:
    """Calls per second over one window (batches of 100 keep the clock out of the figure)."""
    done = 0
    started = time.perf_counter()
    deadline = started + window_s
    while True:
        for _ in range(100):
            call()
        done += 100
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - started)


def figures(module: ModuleType) -> dict[str, Callable[[], Any]]:
    heartbeat, docker_run = heartbeat_frame(), docker_run_frame()
    parse, encode = module.parse_message, module.encode
    agent_to_hub, hub_to_agent = module.AGENT_TO_HUB, module.HUB_TO_AGENT
    parsed_heartbeat = parse(heartbeat, allowed=agent_to_hub)
    parsed_run = parse(docker_run, allowed=hub_to_agent)
    # The figures measure real work: both frames are valid and survive their own round trip.
    assert json.loads(encode(parsed_heartbeat)) == json.loads(heartbeat)
    assert json.loads(encode(parsed_run)) == json.loads(docker_run)
    return {
        "parse_heartbeat": lambda: parse(heartbeat, allowed=agent_to_hub),
        "parse_docker_run": lambda: parse(docker_run, allowed=hub_to_agent),
        "encode_heartbeat": lambda: encode(parsed_heartbeat),
        "encode_docker_run": lambda: encode(parsed_run),
    }


def baselines() -> dict[str, Callable[[], Any]]:
    heartbeat, docker_run = heartbeat_frame(), docker_run_frame()
    heartbeat_data, run_data = json.loads(heartbeat), json.loads(docker_run)
    return {
        "B_json_loads_heartbeat": lambda: json.loads(heartbeat),
        "B_json_loads_docker_run": lambda: json.loads(docker_run),
        "B_json_dumps_heartbeat": lambda: json.dumps(heartbeat_data),
        "B_json_dumps_docker_run": lambda: json.dumps(run_data),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--module", action="append", help="protocol module(s) to measure (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--window", type=float, default=0.5, help="seconds per window")
    parser.add_argument("--name", default="protocol-parse", help="result file name")
    args = parser.parse_args()
    modules = args.module or ["supplier_agent.protocol"]

    calls: dict[str, Callable[[], Any]] = {
        f"{name}:{figure}": call
        for name in modules
        for figure, call in figures(importlib.import_module(name)).items()
    }
    calls.update(baselines())
    samples: dict[str, list[float]] = {label: [] for label in calls}
    # A collection in the middle of one window would charge one figure for everyone's garbage.
    gc.collect()
    gc.disable()
    try:
        for _ in range(args.rounds):
            for label, call in calls.items():
                samples[label].append(rate(call, args.window))
                gc.collect()
    finally:
        gc.enable()

    result: dict[str, Any] = {
        "figure": "protocol parse and encode, per second",
        "machine": common.machine(),
        "rounds": args.rounds,
        "window_s": args.window,
        "frame_bytes": {
            "heartbeat": len(heartbeat_frame().encode()),
            "docker_run": len(docker_run_frame().encode()),
        },
        "per_s": {
            label: {
                "median": round(statistics.median(values)),
                "min": round(min(values)),
                "max": round(max(values)),
            }
            for label, values in samples.items()
        },
    }
    loads = statistics.median(samples["B_json_loads_heartbeat"])
    result["parse_heartbeat_vs_json_loads"] = {
        name: round(statistics.median(samples[f"{name}:parse_heartbeat"]) / loads, 3)
        for name in modules
    }
    common.write_result(args.name, result)


if __name__ == "__main__":
    main()
