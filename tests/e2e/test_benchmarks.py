"""A benchmark of a rental's URL, run by the hub's real Celery worker (issue 21 item 5) with
`cloudgpu-agent bench`'s own code, against a small real OpenAI-compatible server standing in
for the edge (TUNNEL_EDGE_CONNECT points the worker at it; the Host header is the rental's
URL, as the edge routes by it). The figures must be what that server was told to do."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from hub.benchmarks import services as benchmarks
from hub.benchmarks.models import BenchmarkRun
from hub.tunnels import access
from hub.tunnels.models import Tunnel
from tests.hub import factories as f
from tests.support.hub_stack import hub_stack
from tests.support.openai_server import openai_server
from tests.support.polling import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

TTFT_S = 0.2
ITL_S = 0.01


def test_the_worker_measures_the_rentals_own_url_and_keeps_the_figures(tmp_path: Path) -> None:
    lease = f.run_lease(f.register_host(), ports=[8000], access_protected=True)
    tunnel = Tunnel.objects.create(
        lease=lease,
        public_id=uuid.uuid4().hex[:12],
        container_port=8000,
        listen_port=31999,
        state=Tunnel.State.UP,
    )
    with openai_server(ttft_s=TTFT_S, itl_s=ITL_S) as server:
        edge = server.url.removeprefix("http://")
        with hub_stack(
            tmp_path,
            TUNNEL_DOMAIN="rentals.test",
            TUNNEL_URL_SCHEME="http",
            TUNNEL_EDGE_CONNECT=edge,
        ):
            ask = benchmarks.BenchmarkAsk(model="tiny", concurrency=3, isl=12, osl=6, requests=9)
            run = benchmarks.request_benchmark(lease.renter, lease.pk, ask)
            done = wait_for(
                lambda: BenchmarkRun.objects.filter(
                    pk=run.pk, state__in=["done", "failed"]
                ).first(),
                timeout_s=120,
                what="the benchmark's end",
            )
    assert done.state == "done", done.error
    result = done.result
    assert (result["requests"], result["ok"], result["errors"]) == (9, 9, 0)
    assert result["output_tokens"] == 9 * 6
    assert result["url"] == f"http://{tunnel.public_id}-i.rentals.test/v1/completions"
    # What the server saw: the rental's host name, the shape asked for, the concurrency.
    assert set(server.seen.hosts) == {f"{tunnel.public_id}-i.rentals.test"}
    assert server.seen.prompts_words == [12] * 9
    assert server.seen.max_tokens == [6] * 9
    assert server.seen.peak_in_flight == 3
    # The protected URL's token, of this lease, made by the hub for the run.
    assert all(access.grants(lease.pk, token) for token in server.seen.access)
    # Lower bounds only: the server waited this long before and between tokens.
    assert result["ttft_ms"]["p50"] >= TTFT_S * 1000
    assert result["itl_ms"]["p50"] >= ITL_S * 1000
    assert result["requests_per_s"] > 0
    assert result["output_tokens_per_s"] > 0
