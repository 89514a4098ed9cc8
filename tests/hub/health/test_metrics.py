"""/metrics: who may read it, what it says, and that its series do not grow with the fleet."""

from __future__ import annotations

import uuid

import pytest
from django.test import Client
from django.test.utils import override_settings
from prometheus_client.parser import text_string_to_metric_families

from hub.fleet.metrics import OTHER_MODEL, TOP_MODELS
from hub.lib import metrics
from hub.suppliers.models import Gpu, Host
from tests.hub.factories import make_user, register_host

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-0123456789abcdef"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def scrape(client: Client, **headers: str) -> str:
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return response.content.decode()


def test_loopback_reads_the_metrics_and_counters_move(client: Client) -> None:
    before = samples(scrape(client)).get(("cloudgpu_heartbeats_total", ()), 0.0)
    metrics.HEARTBEATS.inc()
    after = samples(scrape(client))
    assert after[("cloudgpu_heartbeats_total", ())] == before + 1


def test_fleet_gauges_count_gpus_by_state_and_model() -> None:
    host = register_host()
    Gpu.objects.filter(host=host).update(unhealthy_since="2026-01-01T00:00:00Z")
    found = samples(scrape(Client()))
    assert found[("cloudgpu_gpus", (("state", "unhealthy"),))] >= 1
    assert found[("cloudgpu_hosts", (("status", "online"),))] >= 1
    name = Gpu.objects.get(host=host).name
    assert found[("cloudgpu_gpus_by_model", (("model", name),))] >= 1


@override_settings(METRICS_ALLOW_NETWORKS=[])
def test_an_address_outside_the_allow_list_is_refused(client: Client) -> None:
    response = client.get("/metrics", REMOTE_ADDR="203.0.113.7")
    assert response.status_code == 403
    assert b"cloudgpu" not in response.content


@override_settings(METRICS_ALLOW_NETWORKS=[], METRICS_TOKEN=TOKEN)
def test_the_bearer_token_lets_a_scraper_in_from_anywhere(client: Client) -> None:
    wrong = client.get(
        "/metrics", REMOTE_ADDR="203.0.113.7", HTTP_AUTHORIZATION="Bearer not-the-token"
    )
    assert wrong.status_code == 401
    assert wrong["WWW-Authenticate"].startswith("Bearer")
    right = client.get("/metrics", REMOTE_ADDR="203.0.113.7", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert right.status_code == 200
    assert b"cloudgpu_heartbeats_total" in right.content


def test_a_thousand_hosts_with_a_thousand_gpu_models_add_no_thousand_series() -> None:
    client = Client()
    baseline = len(samples(scrape(client)))
    owner = make_user("supplier")
    hosts = Host.objects.bulk_create(
        Host(owner=owner, agent_id=uuid.uuid4(), hostname=f"h{n}", status=Host.Status.ONLINE)
        for n in range(1000)
    )
    Gpu.objects.bulk_create(
        Gpu(host=host, index=0, uuid=f"GPU-{n}", name=f"Made-up GPU model {n}")
        for n, host in enumerate(hosts)
    )
    found = samples(scrape(client))
    models = [key for key in found if key[0] == "cloudgpu_gpus_by_model"]
    assert len(models) <= TOP_MODELS + 1
    assert found[("cloudgpu_gpus_by_model", (("model", OTHER_MODEL),))] >= 1000 - TOP_MODELS
    # The fleet grew by 1,000 hosts: the series did not (a few new model labels at most).
    assert len(found) - baseline <= TOP_MODELS + 1
    assert not any("h999" in str(key) or "GPU-999" in str(key) for key in found)
