"""Warm-up commands for renters: templates carry one, rentals (web, API, CLI) set or clear it,
the agent gets it in docker_run, and the lease page says it is warming up and shows a failed
warm-up's last lines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from hub.billing import services as billing
from hub.catalog.models import Template
from hub.leases.models import Command, Lease
from hub.suppliers.models import Gpu, Host
from supplier_agent.protocol import HUB_TO_AGENT, DockerRun, parse_message
from tests.hub import factories as f
from tests.hub.api.conftest import client_for

pytestmark = pytest.mark.django_db

WARMUP = ["sh", "-c", "curl -sf localhost:8000/warmup"]


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def host() -> Host:
    return f.register_host(gpus=[0, 1])


@pytest.fixture
def template() -> Template:
    return Template.objects.create(slug="vllm", name="vLLM", image="busybox", warmup=WARMUP)


def _renter() -> Any:
    renter = f.make_user("renter")
    billing.adjust(renter, 50_000_000, "test top-up", f.make_user("admin", is_staff=True))
    return renter


def _docker_run_warmup(lease: Lease) -> Any:
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    command = f.command_of(lease, Command.Kind.DOCKER_RUN)
    message = parse_message(json.dumps(command.payload), allowed=HUB_TO_AGENT)
    assert isinstance(message, DockerRun)
    return message.warmup


def test_a_template_s_warm_up_reaches_the_agent_and_a_renter_may_clear_it(
    host: Host, template: Template
) -> None:
    api = client_for(_renter())
    body = {"host_id": host.pk, "template": "vllm"}
    made = api.post("/api/v1/leases/", {**body, "gpu_indices": [0]}, format="json")
    assert made.status_code == 201, made.json()
    assert made.json()["warmup"] == WARMUP
    assert _docker_run_warmup(Lease.objects.get(pk=made.json()["id"])) == tuple(WARMUP)
    cleared = api.post("/api/v1/leases/", {**body, "gpu_indices": [1], "warmup": []}, format="json")
    assert cleared.status_code == 201, cleared.json()
    assert Lease.objects.get(pk=cleared.json()["id"]).warmup is None
    listed = api.get("/api/v1/templates/").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert next(t for t in rows if t["slug"] == "vllm")["warmup"] == WARMUP


def test_the_rent_form_takes_a_warm_up_and_the_page_says_it_is_warming_up(host: Host) -> None:
    renter = _renter()
    client = Client()
    client.force_login(renter)
    gpu = Gpu.objects.get(host=host, index=0)
    response = client.post(
        reverse("web:rent", args=[gpu.pk]),
        {
            "image": f.TEST_IMAGE,
            "warmup": "python -c 'import torch; torch.zeros(1).cuda()'",
            "seen_price_micros": str(gpu.price_per_hour_micros),
        },
    )
    assert response.status_code == 302
    lease = Lease.objects.get(renter=renter)
    assert lease.warmup == ["python", "-c", "import torch; torch.zeros(1).cuda()"]
    f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    page = client.get(reverse("web:lease", args=[lease.pk])).content.decode()
    assert 'id="warming-up"' in page
    assert "python -c &#x27;import torch; torch.zeros(1).cuda()&#x27;" in page


def test_a_failed_warm_up_s_last_lines_reach_the_renter(host: Host) -> None:
    renter = _renter()
    lease = f.start_lease(host, renter=renter, warmup=["sh", "/warm.sh"])
    f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    reason = (
        "warm-up `sh /warm.sh` failed with exit code 3; last lines:\n"
        "loading weights\nCUDA out of memory"
    )
    f.ack(f.command_of(lease, Command.Kind.DOCKER_RUN), ok=False, error=reason)
    client = Client()
    client.force_login(renter)
    page = client.get(reverse("web:lease", args=[lease.pk])).content.decode()
    assert "loading weights\nCUDA out of memory" in page
    assert 'id="warming-up"' not in page


def test_the_cli_takes_a_warm_up(host: Host) -> None:
    renter = f.make_user("renter")
    call_command(
        "hub", "lease", "start", "--renter", renter.username, "--host", str(host.pk),
        "--image", f.TEST_IMAGE, "--warmup", "sh -c 'sleep 1'", "--wait", "0",
    )  # fmt: skip
    assert Lease.objects.get(renter=renter).warmup == ["sh", "-c", "sleep 1"]
