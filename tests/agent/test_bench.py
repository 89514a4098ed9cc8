"""`cloudgpu-agent bench` against a real OpenAI-compatible server the test starts: the figures
must be what that server was told to do."""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from supplier_agent import bench
from tests.support.agents import AGENT, agent_env
from tests.support.openai_server import openai_server

TTFT_S = 0.3
ITL_S = 0.02


def _bench(url: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, "bench", "--url", url, "--model", "tiny", *args],
        capture_output=True,
        text=True,
        env=agent_env(**env),
        timeout=120,
        check=False,
    )


def _summary(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def test_closed_loop_figures_match_what_the_server_did() -> None:
    with openai_server(ttft_s=TTFT_S, itl_s=ITL_S, api_key="sk-test") as server:
        result = _bench(
            f"{server.url}/v1", "--concurrency", "4", "--requests", "8", "--isl", "16",
            "--osl", "5", "--json", OPENAI_API_KEY="sk-test",
        )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    summary = _summary(result)
    assert summary["mode"] == "closed loop"
    assert (summary["ok"], summary["errors"]) == (8, 0)
    assert summary["output_tokens"] == 8 * 5
    assert server.seen.prompts_words == [16] * 8
    assert server.seen.max_tokens == [5] * 8
    assert set(server.seen.authorizations) == {"Bearer sk-test"}  # from OPENAI_API_KEY
    assert server.seen.peak_in_flight == 4
    # Lower bounds only: the server waited this long, so no request can have been faster.
    assert summary["ttft_ms"]["p50"] >= TTFT_S * 1000
    assert summary["itl_ms"]["p50"] >= ITL_S * 1000
    assert summary["requests_per_s"] > 0
    assert summary["output_tokens_per_s"] > 0


def test_the_table_names_each_figure() -> None:
    with openai_server(ttft_s=0, itl_s=0) as server:
        result = _bench(server.url, "--requests", "2", "--osl", "3")
    assert result.returncode == 0, result.stderr
    for label in ("requests/s", "output tokens/s", "TTFT p50 / p99", "ITL p50 / p99"):
        assert label in result.stdout
    assert "2 ok, 0 failed" in result.stdout


def test_open_loop_sends_at_the_rate_and_counts_all() -> None:
    with openai_server(ttft_s=0, itl_s=0) as server:
        result = _bench(server.url, "--rate", "50", "--requests", "5", "--osl", "2", "--json")
    assert result.returncode == 0, result.stderr
    summary = _summary(result)
    assert summary["mode"] == "open loop"
    assert summary["ok"] == 5
    assert summary["output_tokens"] == 10


def test_errors_are_counted_and_exit_1() -> None:
    with openai_server(ttft_s=0, itl_s=0, api_key="right") as server:
        result = _bench(server.url, "--requests", "3", "--api-key", "wrong")
    assert result.returncode == 1
    assert "0 ok, 3 failed" in result.stdout
    assert "HTTP 401" in result.stdout


def test_unusable_settings_are_a_usage_error() -> None:
    assert _bench("ftp://example.com").returncode == 2
    assert _bench("http://127.0.0.1:9", "--dataset", "sharegpt").returncode == 2


def test_the_hubs_worker_reaches_an_edge_by_address_with_its_headers_and_time_limit() -> None:
    # hub/benchmarks: the URL's host in the Host header, the connection to another address (the
    # edge), an extra header (the access token), and no request past the run's time limit.
    with openai_server(ttft_s=0.0, itl_s=0.0) as server:
        port = int(server.url.rsplit(":", 1)[1])
        summary = bench.run_bench(
            bench.BenchOptions(
                url="http://abc123-i.rentals.invalid:8080/",
                model="tiny",
                requests=3,
                osl=2,
                isl=4,
                headers=(("X-CloudGPU-Access", "cgpa_x"),),
                connect_to=f"127.0.0.1:{port}",
                max_duration_s=60,
            )
        )
    assert (summary["ok"], summary["errors"]) == (3, 0)
    assert server.seen.hosts == ["abc123-i.rentals.invalid:8080"] * 3
    assert server.seen.access == ["cgpa_x"] * 3
    assert "connect_to" not in summary["settings"]
    assert "headers" not in summary["settings"]


def test_requests_not_sent_within_the_time_limit_are_errors() -> None:
    with openai_server(ttft_s=0.0, itl_s=0.5) as server:
        summary = bench.run_bench(
            bench.BenchOptions(
                url=server.url, model="tiny", requests=4, osl=4, isl=1, max_duration_s=0.5
            )
        )
    # The first request streams for at least 1.5 s, a token every 0.5 s (each within a read
    # timeout): it is cut at the limit all the same, and the three after it are never sent.
    assert summary["requests"] == 4
    assert summary["ok"] == 0
    assert "not sent: the run's time limit passed" in summary["error_examples"]
    assert len(server.seen.max_tokens) <= 1


def test_a_bad_connect_to_is_refused() -> None:
    with pytest.raises(bench.BenchError, match="host:port"):
        bench.run_bench(bench.BenchOptions(url="http://x:1/", model="m", connect_to="nowhere"))
