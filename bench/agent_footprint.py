"""The agent's footprint on a supplier's host (issue 8), with 8 fake GPUs.

    python -m bench.agent_footprint --seconds 120

A real ``cloudgpu-agent run`` (Docker runtime, ``--gpu-devices none``, the fake NVML with 8
GPUs: the only thing faked is the GPU hardware) connected to a hub at the production timings
(heartbeat every 15 s). Figures: idle RSS (goal <= 40 MB) and CPU in % of one core (goal <=
0.5 %), per 15 s window; and NVML sampling time per heartbeat for 8 GPUs, i.e. the agent's
own ``Nvml.gpus()`` timed in this process against the same fake (which re-reads its JSON table
on every call, so this is the agent's code plus the fake, not a real driver's cost).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench import common
from bench.dispatch import _people, _start_agent, _wait_online, agent_env

GPUS = 8


def nvml_sampling(table_path: Path, rounds: int = 200) -> dict[str, float | int]:
    """ms per ``Nvml.gpus()`` (one heartbeat's sampling) against the fake NVML."""
    os.environ["CLOUDGPU_FAKE_NVML_TABLE"] = str(table_path)
    sys.path.insert(0, str(common.FAKE_NVML_DIR))
    sys.modules.pop("pynvml", None)
    from supplier_agent.gpu import Nvml

    nvml = Nvml()
    assert len(nvml.gpus()) == GPUS
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        nvml.gpus()
        samples.append((time.perf_counter() - started) * 1000)
    return common.summary(samples, digits=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="idle time measured")
    parser.add_argument("--settle", type=float, default=20.0)
    args = parser.parse_args()
    from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env

    env = common.bench_env()
    common.prepare(env)
    result: dict[str, Any] = {"figure": "agent footprint", "machine": common.machine()}
    common.setup_django(env)
    with tempfile.TemporaryDirectory(prefix="cloudgpu-bench-footprint-") as folder:
        table = FakeGpuTable.create(Path(folder) / "gpus.json", gpu_count=GPUS)
        (Path(folder) / "locks").mkdir()
        result["nvml_sampling_8_gpus_ms"] = nvml_sampling(table.path)
        with common.Hub(env).start() as hub:
            supplier, _, token = _people(env, "footprint")
            process = _start_agent(
                hub,
                token,
                Path(folder) / "agent",
                # --allow-local-images: no registry here, the image is built locally.
                [
                    "--gpu-devices",
                    "none",
                    "--lock-dir",
                    str(Path(folder) / "locks"),
                    "--allow-local-images",
                ],
                agent_env(**fake_nvml_env(table.path)),
            )
            try:
                _wait_online(supplier)
                time.sleep(args.settle)
                agent = psutil.Process(process.pid)
                windows = []
                for _ in range(max(1, int(args.seconds // 15))):
                    meter = common.CpuMeter({"agent": process.pid})
                    time.sleep(15)
                    windows.append({
                        "cpu_pct": meter.percent()["agent"],
                        "rss_mib": round(agent.memory_info().rss / 2**20, 1),
                    })  # fmt: skip
                threads = agent.num_threads()
            finally:
                common.stop_tree(process)
    result.update(
        gpus=GPUS,
        windows_15s=windows,
        cpu_pct_median=common.median([w["cpu_pct"] for w in windows]),
        cpu_pct_max=max(w["cpu_pct"] for w in windows),
        rss_mib_median=common.median([w["rss_mib"] for w in windows]),
        threads=threads,
    )
    common.write_result("agent-footprint", result)


if __name__ == "__main__":
    main()
