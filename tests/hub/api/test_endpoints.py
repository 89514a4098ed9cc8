"""Every endpoint's happy path, bad input, and one renter never seeing another's leases."""

from __future__ import annotations

import json
import re

import pytest
from rest_framework.test import APIClient

from hub.accounts.models import User
from hub.catalog.models import Template
from hub.leases import logs as lease_logs
from hub.leases.models import Command, Lease
from hub.suppliers import liveness
from hub.suppliers.models import Gpu, Host
from hub.tunnels import access
from hub.tunnels import services as tunnels
from tests.hub import factories as f
from tests.hub.api.conftest import client_for, top_up

pytestmark = pytest.mark.django_db

GIB = 1 << 30


@pytest.fixture
def host() -> Host:
    host = f.register_host(gpus=(f.gpu_state(0), f.gpu_state(1, memory_total_bytes=80 * GIB)))
    Gpu.objects.filter(host=host, index=0).update(price_per_hour_micros=500_000)
    Gpu.objects.filter(host=host, index=1).update(price_per_hour_micros=2_000_000)
    return host


def gpu_id(host: Host, index: int) -> int:
    return Gpu.objects.get(host=host, index=index).pk


def rent(api: APIClient, **body: object) -> dict:
    response = api.post("/api/v1/leases/", body, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_offers_are_filtered_and_sorted_with_money_in_micros_and_words(
    api: APIClient, host: Host
) -> None:
    offers = api.get("/api/v1/offers/").json()
    assert [o["gpu_index"] for o in offers] == [0, 1]
    assert offers[0]["price_per_hour_micros"] == 500_000
    assert offers[0]["price_per_hour"] == "$0.50"
    assert offers[0]["gpu_id"] == gpu_id(host, 0)
    assert [o["gpu_index"] for o in api.get("/api/v1/offers/?sort=-price").json()] == [1, 0]
    assert [o["gpu_index"] for o in api.get("/api/v1/offers/?min_vram_gib=40").json()] == [1]
    assert [o["gpu_index"] for o in api.get("/api/v1/offers/?max_price=1.5").json()] == [0]
    assert api.get("/api/v1/offers/?model=H100").json() == []


@pytest.mark.parametrize(
    ("query", "field"),
    [("sort=cheapest", "sort"), ("min_vram_gib=-1", "min_vram_gib"), ("max_price=x", "max_price")],
)
def test_bad_offer_filters_are_400(api: APIClient, query: str, field: str) -> None:
    response = api.get(f"/api/v1/offers/?{query}")
    assert response.status_code == 400
    assert field in response.json()["errors"]
    assert response.json()["detail"].startswith(f"{field}:")


def test_templates_are_the_listed_ones(api: APIClient) -> None:
    Template.objects.filter(slug="comfyui").update(listed=False)
    slugs = [t["slug"] for t in api.get("/api/v1/templates/").json()]
    assert "pytorch-jupyterlab" in slugs
    assert "comfyui" not in slugs
    detail = api.get("/api/v1/templates/pytorch-jupyterlab/").json()
    assert detail["image"]
    assert detail["ports"] == [8888]
    assert api.get("/api/v1/templates/comfyui/").status_code == 404


def test_renting_by_offer_with_a_template_then_reading_and_stopping(
    api: APIClient, renter: User, host: Host
) -> None:
    top_up(renter, 10_000_000)
    lease = rent(api, gpu_ids=[gpu_id(host, 0)], template="pytorch-jupyterlab")
    assert lease["state"] == "reserving"
    assert lease["image"] == Template.objects.get(slug="pytorch-jupyterlab").image
    assert lease["ports"] == [8888]
    assert lease["gpus"] == [
        {"gpu_id": gpu_id(host, 0), "index": 0, "model": lease["gpus"][0]["model"]}
    ]
    assert lease["price_per_hour"] == "$0.50"
    assert lease["cost_micros"] == 0
    assert lease["end_reason"] == ""
    assert lease["ended_at"] is None

    assert [x["id"] for x in api.get("/api/v1/leases/").json()["results"]] == [lease["id"]]
    assert api.get(f"/api/v1/leases/{lease['id']}/").json()["state"] == "reserving"

    stopped = api.post(f"/api/v1/leases/{lease['id']}/stop/")
    assert stopped.status_code == 200
    assert stopped.json()["state"] == "stopping"
    assert stopped.json()["end_reason"] == "renter_stop"
    assert Command.objects.filter(lease_id=lease["id"], kind=Command.Kind.RELEASE).exists()
    # Stopping twice is harmless.
    assert api.post(f"/api/v1/leases/{lease['id']}/stop/").status_code == 200


def test_renting_by_host_and_indices_with_a_custom_image(api: APIClient, host: Host) -> None:
    Gpu.objects.filter(host=host).update(price_per_hour_micros=0)
    lease = rent(
        api,
        host_id=host.pk,
        gpu_indices=[0, 1],
        image=f.TEST_IMAGE,
        ports=[8080, 9090],
        env={"GREETING": "hi"},
        command=["httpd", "-f"],
    )
    row = Lease.objects.get(pk=lease["id"])
    assert row.image == f.TEST_IMAGE
    assert row.ports == [8080, 9090]
    assert row.env == {"GREETING": "hi"}
    assert row.command == ["httpd", "-f"]
    assert sorted(g["index"] for g in lease["gpus"]) == [0, 1]


def test_a_running_lease_shows_its_urls_cost_and_logs(
    api: APIClient, renter: User, settings: object
) -> None:
    settings.TUNNEL_DOMAIN = "gpus.example.com"  # type: ignore[attr-defined]
    host = f.register_host(gpus=(0,))
    lease = f.run_lease(host, renter=renter)  # free GPU: price 0
    tunnels.allocate(lease)
    Lease.objects.filter(pk=lease.pk).update(log_tail="hello from the container\n")
    body = api.get(f"/api/v1/leases/{lease.pk}/").json()
    assert body["state"] == "running"
    [url] = body["urls"]
    assert url["port"] == 8080
    assert url["state"] == "pending"
    assert url["url"].endswith("-i.gpus.example.com/")
    assert body["cost"] == "$0.000000"

    logs = api.get(f"/api/v1/leases/{lease.pk}/logs/").json()
    assert logs == {
        "lease_id": str(lease.pk),
        "state": "running",
        "log": "",
        "log_tail": "hello from the container\n",
        "streamed": False,
    }
    # Chunks kept while the renter's page followed the lease (hub/leases/logs.py).
    key = lease_logs.backlog_key(str(lease.pk))
    for seq, data in ((1, "epoch 1\n"), (2, "epoch 2\n")):
        liveness.sync_client().rpush(key, json.dumps({"seq": seq, "data": data}))
    try:
        logs = api.get(f"/api/v1/leases/{lease.pk}/logs/").json()
    finally:
        liveness.sync_client().delete(key)
    assert logs["log"] == "epoch 1\nepoch 2\n"
    assert logs["streamed"] is True


def test_a_protected_lease_gets_an_access_token(api: APIClient, renter: User) -> None:
    host = f.register_host(gpus=(0, 1))
    protected = f.start_lease(host, [0], renter=renter, access_protected=True)
    token = api.post(f"/api/v1/leases/{protected.pk}/access-token/")
    assert token.status_code == 200
    assert access.grants(protected.pk, token.json()["token"])
    assert token.json()["header"] == access.HEADER

    open_lease = f.start_lease(host, [1], renter=renter)
    refused = api.post(f"/api/v1/leases/{open_lease.pk}/access-token/")
    assert refused.status_code == 400
    assert "not protected" in refused.json()["detail"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"image": "Not An Image!"}, "not a valid image reference"),
        ({"image": f.TEST_IMAGE, "ports": [70000]}, "port"),
        ({"image": f.TEST_IMAGE, "ports": [0]}, "port"),
        ({"template": "no-such-template"}, "no template 'no-such-template'"),
        ({"image": f.TEST_IMAGE, "env": {"LD_PRELOAD": "/x.so"}}, "LD_PRELOAD"),
        ({}, "choose a `template` or give an `image`"),
    ],
)
def test_bad_lease_input_is_400_with_a_clear_message(
    api: APIClient, host: Host, body: dict, message: str
) -> None:
    response = api.post("/api/v1/leases/", {"gpu_ids": [gpu_id(host, 0)], **body}, format="json")
    assert response.status_code == 400
    assert message in response.json()["detail"]
    assert not Lease.objects.exists()


@pytest.mark.parametrize(
    ("gpus", "message"),
    [
        ({}, "either by `gpu_ids`"),
        ({"gpu_ids": [999999]}, "no GPU with id 999999"),
        ({"host_id": 999999, "gpu_indices": [0]}, "no host with id 999999"),
        ({"host_id": 1}, "go together"),
    ],
)
def test_bad_gpu_choices_are_400(api: APIClient, gpus: dict, message: str) -> None:
    response = api.post("/api/v1/leases/", {"image": f.TEST_IMAGE, **gpus}, format="json")
    assert response.status_code == 400
    assert message in response.json()["detail"]


def test_a_gpu_that_is_not_free_is_400(api: APIClient, host: Host) -> None:
    Gpu.objects.filter(host=host).update(price_per_hour_micros=0)
    f.start_lease(host, [0])
    response = api.post(
        "/api/v1/leases/", {"gpu_ids": [gpu_id(host, 0)], "image": f.TEST_IMAGE}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"detail": "that GPU was just rented by someone else"}


def test_out_of_funds_is_400(api: APIClient, host: Host) -> None:
    response = api.post(
        "/api/v1/leases/", {"gpu_ids": [gpu_id(host, 1)], "image": f.TEST_IMAGE}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("out of funds")


def test_malformed_json_is_400(api: APIClient) -> None:
    response = api.post("/api/v1/leases/", "{", content_type="application/json")
    assert response.status_code == 400
    assert "JSON" in response.json()["detail"]


def test_another_renter_s_lease_is_404_everywhere(api: APIClient, renter: User) -> None:
    host = f.register_host(gpus=(0,))
    lease = f.start_lease(host, [0], renter=renter, access_protected=True)
    intruder = client_for(f.make_user("intruder"))
    base = f"/api/v1/leases/{lease.pk}"
    assert intruder.get(f"{base}/").status_code == 404
    assert intruder.get(f"{base}/logs/").status_code == 404
    assert intruder.post(f"{base}/stop/").status_code == 404
    assert intruder.post(f"{base}/access-token/").status_code == 404
    assert intruder.get("/api/v1/leases/").json()["results"] == []
    lease.refresh_from_db()
    assert lease.state == Lease.State.RESERVING  # the intruder's stop did nothing


def test_the_account_shows_balance_and_recent_ledger_rows(api: APIClient, renter: User) -> None:
    top_up(renter, 12_500_000)
    body = api.get("/api/v1/account/").json()
    assert body["username"] == renter.username
    assert body["balance_micros"] == 12_500_000
    assert body["balance"] == "$12.500000"
    [row] = body["ledger"]
    assert row["kind"] == "adjustment"
    assert row["amount_micros"] == 12_500_000
    assert row["reason"] == "test top-up"
    assert row["lease_id"] is None


def test_the_schema_and_docs_are_served_without_a_cdn(client: object) -> None:
    schema = client.get("/api/schema/")  # type: ignore[attr-defined]
    assert schema.status_code == 200
    assert b"/api/v1/leases/{id}/logs/" in schema.content
    assert b"recent live output the hub kept" in schema.content
    docs = client.get("/api/docs/")  # type: ignore[attr-defined]
    assert docs.status_code == 200
    # Every asset from the hub itself: no src or href to another host (the page's random
    # nonces and tokens may spell "cdn" by chance, so the test looks at links, not letters).
    assert re.findall(rb'(?:src|href)=["\'](?:https?:)?//', docs.content) == []
    assert b"drf_spectacular_sidecar/swagger-ui-dist" in docs.content
