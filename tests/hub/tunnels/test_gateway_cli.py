"""The gateway's command line refuses what would break renters before it starts anything."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.processes import hub_env, python_module

SECRET = "s" * 40


def _run_gateway(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    argv = python_module(
        "hub.tunnels.gateway", "run", "--folder", str(tmp_path), "--hub-url",
        "http://127.0.0.1:9", *args,
    )  # fmt: skip
    return subprocess.run(
        argv,
        env=hub_env(TUNNEL_GATEWAY_SECRET=SECRET, **env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_timeout_below_620_s_is_refused_at_start(tmp_path: Path) -> None:
    by_flag = _run_gateway(tmp_path, "--timeout", "600")
    assert by_flag.returncode == 2
    assert "600 is below 620 s" in by_flag.stderr
    by_env = _run_gateway(tmp_path, TUNNEL_EDGE_TIMEOUT_S="300")
    assert by_env.returncode == 2
    assert "TUNNEL_EDGE_TIMEOUT_S) 300 is below 620 s" in by_env.stderr
    assert not (tmp_path / "nginx.conf").exists()  # refused before anything was written
