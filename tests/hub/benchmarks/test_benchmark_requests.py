"""Who may ask the hub's worker to benchmark a rental, within what bounds, against what
(issue 21 item 5). The run itself, with a real worker and server: tests/e2e/test_benchmarks.py."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from hub.accounts.api_tokens import create_api_token
from hub.accounts.models import ApiScope
from hub.benchmarks import services as benchmarks
from hub.benchmarks.models import BenchmarkRun
from hub.leases.models import Lease
from hub.tunnels import access
from hub.tunnels.models import Tunnel
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

_listen_ports = itertools.count(30000)
ASK = benchmarks.BenchmarkAsk(model="tiny", concurrency=2, isl=16, osl=4, requests=8)


def _running_with_url(*ports: int, **spec: Any) -> Lease:
    lease = f.run_lease(f.register_host(), ports=list(ports or (8000,)), **spec)
    for port in ports or (8000,):
        Tunnel.objects.create(
            lease=lease,
            public_id=uuid.uuid4().hex[:12],
            container_port=port,
            listen_port=next(_listen_ports),
            state=Tunnel.State.UP,
        )
    return lease


def test_a_renter_queues_a_run_of_their_running_leases_url(settings: Any) -> None:
    settings.TUNNEL_DOMAIN, settings.TUNNEL_URL_SCHEME = "rentals.example", "https"
    lease = _running_with_url(8000, 9000)

    run = benchmarks.request_benchmark(lease.renter, lease.pk, ASK)

    assert run.state == BenchmarkRun.State.QUEUED
    assert (run.port, run.model, run.concurrency, run.requests) == (8000, "tiny", 2, 8)
    options = benchmarks.bench_options(run)
    tunnel = Tunnel.objects.get(lease=lease, container_port=8000)
    # The lease's own URL, built by the hub: nothing the renter typed names a host.
    assert options.url == f"https://{tunnel.public_id}-i.rentals.example/"
    assert options.max_duration_s == settings.BENCH_MAX_DURATION_S
    assert options.headers == ()


def test_another_port_of_the_lease_is_chosen_by_number_only() -> None:
    lease = _running_with_url(8000, 9000)
    run = benchmarks.request_benchmark(
        lease.renter, lease.pk, benchmarks.BenchmarkAsk(model="m", port=9000)
    )
    assert run.port == 9000
    other = _running_with_url(8000, 9000)
    with pytest.raises(benchmarks.BenchmarkRefused, match=r"port 22 has no URL.*8000, 9000"):
        benchmarks.request_benchmark(other.renter, other.pk, benchmarks.BenchmarkAsk("m", port=22))


def test_a_protected_url_gets_an_access_token_of_its_own_lease() -> None:
    lease = _running_with_url(8000, access_protected=True)
    options = benchmarks.bench_options(benchmarks.request_benchmark(lease.renter, lease.pk, ASK))
    (name, token), *_ = options.headers
    assert name == "X-CloudGPU-Access"
    assert access.grants(lease.pk, token)


def test_someone_elses_lease_is_no_such_lease() -> None:
    lease = _running_with_url()
    with pytest.raises(benchmarks.NoSuchLease):
        benchmarks.request_benchmark(f.make_user("other"), lease.pk, ASK)
    assert not BenchmarkRun.objects.exists()


def test_only_a_running_lease_with_a_url_is_measured() -> None:
    starting = f.start_lease(f.register_host())
    with pytest.raises(benchmarks.BenchmarkRefused, match="only a running one"):
        benchmarks.request_benchmark(starting.renter, starting.pk, ASK)
    no_url = f.run_lease(f.register_host())
    with pytest.raises(benchmarks.BenchmarkRefused, match="no URL"):
        benchmarks.request_benchmark(no_url.renter, no_url.pk, ASK)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("requests", 201, "requests: must be a whole number from 1 to 200"),
        ("concurrency", 9, "concurrency: must be a whole number from 1 to 8"),
        ("concurrency", 0, "concurrency: must be a whole number from 1 to 8"),
        ("isl", 4097, "isl: must be a whole number from 1 to 4096"),
        ("osl", 1025, "osl: must be a whole number from 1 to 1024"),
        ("model", "", "model: name the model"),
        ("model", "x" * 201, "model: a model name is at most 200"),
        ("model", "bad\nname", "model: a model name is at most 200 printable"),
    ],
)
def test_asks_beyond_the_bounds_are_refused_saying_which(
    field: str, value: Any, message: str
) -> None:
    lease = _running_with_url()
    ask = benchmarks.BenchmarkAsk(**{**ASK.__dict__, field: value})
    with pytest.raises(benchmarks.BenchmarkRefused, match=message):
        benchmarks.request_benchmark(lease.renter, lease.pk, ask)
    assert not BenchmarkRun.objects.exists()


def test_one_run_at_a_time_per_lease_and_a_cap_on_the_hub(settings: Any) -> None:
    lease = _running_with_url()
    benchmarks.request_benchmark(lease.renter, lease.pk, ASK)
    with pytest.raises(benchmarks.BenchmarkRefused, match="is running; wait"):
        benchmarks.request_benchmark(lease.renter, lease.pk, ASK)
    settings.BENCH_MAX_RUNNING = 1
    other = _running_with_url()
    with pytest.raises(benchmarks.BenchmarkRefused, match="as many benchmarks as it may"):
        benchmarks.request_benchmark(other.renter, other.pk, ASK)


def test_a_run_the_worker_never_finished_stops_blocking_the_lease() -> None:
    lease = _running_with_url()
    stuck = benchmarks.request_benchmark(lease.renter, lease.pk, ASK)
    BenchmarkRun.objects.filter(pk=stuck.pk).update(
        created_at=timezone.now() - timedelta(hours=1), state=BenchmarkRun.State.RUNNING
    )
    again = benchmarks.request_benchmark(lease.renter, lease.pk, ASK)
    stuck.refresh_from_db()
    assert stuck.state == BenchmarkRun.State.FAILED
    assert "did not finish" in stuck.error
    assert again.state == BenchmarkRun.State.QUEUED


def test_a_lease_that_stopped_meanwhile_is_not_measured() -> None:
    lease = _running_with_url()
    run = benchmarks.request_benchmark(lease.renter, lease.pk, ASK)
    Lease.objects.filter(pk=lease.pk).update(state=Lease.State.ENDED)
    run.refresh_from_db()
    with pytest.raises(benchmarks.BenchmarkRefused, match="only a running one"):
        benchmarks.bench_options(run)


def test_the_api_queues_lists_and_refuses_in_words() -> None:
    lease = _running_with_url()
    _, token = create_api_token(lease.renter, "bench", scopes=[ApiScope.READ, ApiScope.LEASES])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    url = f"/api/v1/leases/{lease.pk}/benchmarks/"

    bad = client.post(url, {"model": "tiny", "requests": 100000}, content_type="application/json")
    assert bad.status_code == 400
    assert bad.json()["detail"] == "requests: must be a whole number from 1 to 200"
    made = client.post(url, {"model": "tiny", "requests": 4}, content_type="application/json")
    assert made.status_code == 202, made.json()
    assert made.json()["state"] == "queued"
    busy = client.post(url, {"model": "tiny"}, content_type="application/json")
    assert busy.status_code == 400
    assert "is running; wait" in busy.json()["detail"]
    listed = client.get(url)
    assert [run["id"] for run in listed.json()] == [made.json()["id"]]
    other = f.make_user("other")
    _, other_token = create_api_token(other, "x", scopes=[ApiScope.READ, ApiScope.LEASES])
    stranger = Client(HTTP_AUTHORIZATION=f"Bearer {other_token}")
    assert stranger.get(url).status_code == 404
    assert stranger.post(url, {"model": "m"}, content_type="application/json").status_code == 404


def test_the_lease_page_offers_the_form_and_says_why_an_ask_was_refused() -> None:
    lease = _running_with_url()
    client = Client()
    client.force_login(lease.renter)
    page = client.get(f"/leases/{lease.pk}/")
    assert b'id="benchmark-form"' in page.content

    refused = client.post(
        f"/leases/{lease.pk}/benchmarks/",
        {"model": "tiny", "concurrency": 50, "isl": 8, "osl": 4, "requests": 4, "port": 8000},
        follow=True,
    )
    assert "Benchmark not started: concurrency: Ensure this value is less than or equal to 8" in (
        refused.content.decode()
    )
    assert not BenchmarkRun.objects.exists()

    client.post(
        f"/leases/{lease.pk}/benchmarks/",
        {"model": "tiny", "concurrency": 2, "isl": 8, "osl": 4, "requests": 4, "port": 8000},
    )
    run = BenchmarkRun.objects.get()
    BenchmarkRun.objects.filter(pk=run.pk).update(
        state=BenchmarkRun.State.DONE,
        result={
            "requests_per_s": 3.5,
            "output_tokens_per_s": 14.0,
            "ttft_ms": {"p50": 101.0, "p99": 140.0},
            "itl_ms": {"p50": 20.5, "p99": 30.0},
            "errors": 0,
            "error_examples": [],
        },
    )
    shown = client.get(f"/leases/{lease.pk}/benchmarks/panel/").content.decode()
    assert '<td class="bench-rps">3.5</td>' in shown
    assert "101.0 / 140.0" in shown
    assert "20.5 / 30.0" in shown
    assert client.get(f"/leases/{lease.pk}/benchmarks/panel/").status_code == 200
    stranger = Client()
    stranger.force_login(f.make_user("other"))
    assert stranger.get(f"/leases/{lease.pk}/benchmarks/panel/").status_code == 404
