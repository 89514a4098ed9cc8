"""Issue 38 item 3: asking for funds through the API (what the usage page's form does), for
`cloudgpu topup`: the `leases` scope to ask, `read` to list, the services' bounds as 400s."""

from __future__ import annotations

import pytest

from hub.billing.models import TopUpRequest
from hub.billing.topups import MAX_WAITING
from tests.hub import factories as f
from tests.hub.api.conftest import client_for

pytestmark = pytest.mark.django_db


def test_a_renter_asks_for_funds_and_sees_the_request_waiting() -> None:
    renter = f.make_user("renter")
    api = client_for(renter)
    response = api.post(
        "/api/v1/top-ups/", {"amount": "25.00", "note": "  by  wire "}, format="json"
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["amount"] == "$25.00"
    assert body["amount_micros"] == 25_000_000
    assert body["state"] == "waiting"
    assert body["note"] == "by wire"
    (row,) = TopUpRequest.objects.filter(account=renter)
    assert row.pk == body["id"]
    assert [r["id"] for r in api.get("/api/v1/top-ups/").json()] == [row.pk]


def test_amounts_outside_the_bounds_are_refused_with_a_sentence() -> None:
    api = client_for(f.make_user("renter"))
    for amount in ("0.50", "100000.01"):
        response = api.post("/api/v1/top-ups/", {"amount": amount}, format="json")
        assert response.status_code == 400
        assert "between $1 and $100,000" in response.json()["detail"]
    response = api.post("/api/v1/top-ups/", {"amount": "lots"}, format="json")
    assert response.status_code == 400
    assert "amount" in response.json()["errors"]
    assert not TopUpRequest.objects.exists()


def test_at_most_max_waiting_requests_wait_at_once() -> None:
    api = client_for(f.make_user("renter"))
    for _ in range(MAX_WAITING):
        assert api.post("/api/v1/top-ups/", {"amount": "5"}, format="json").status_code == 201
    refused = api.post("/api/v1/top-ups/", {"amount": "5"}, format="json")
    assert refused.status_code == 400
    assert "waiting already" in refused.json()["detail"]


def test_asking_needs_the_leases_scope_and_listing_read() -> None:
    renter = f.make_user("renter")
    reader = client_for(renter, ["read"])
    refused = reader.post("/api/v1/top-ups/", {"amount": "5"}, format="json")
    assert refused.status_code == 403
    assert "'leases'" in refused.json()["detail"]
    assert reader.get("/api/v1/top-ups/").status_code == 200
    assert client_for(renter, ["leases"]).get("/api/v1/top-ups/").status_code == 403


def test_only_your_own_requests_are_listed() -> None:
    mine, theirs = f.make_user("renter"), f.make_user("renter")
    client_for(theirs).post("/api/v1/top-ups/", {"amount": "5"}, format="json")
    assert client_for(mine).get("/api/v1/top-ups/").json() == []
