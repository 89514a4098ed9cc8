"""Every error under /api/ is JSON in the documented shape, whatever raised it."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.hub import factories as f

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "path", ["/api/v1/leases/not-a-uuid/", "/api/v1/leases/1/stop/", "/api/v1/nothing-here/"]
)
def test_a_malformed_id_or_unknown_path_is_json_404(api: APIClient, path: str) -> None:
    response = api.get(path)

    assert response.status_code == 404
    assert response["content-type"] == "application/json"
    assert response.json() == {"detail": "Not found."}


def test_outside_the_api_a_404_stays_a_page() -> None:
    response = Client().get("/no-such-page/")

    assert response.status_code == 404
    assert response["content-type"].startswith("text/html")


def test_a_session_call_without_its_csrf_token_is_json_403() -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(f.make_user("renter"))

    response = client.post("/api/v1/tokens/", {"name": "x"}, content_type="application/json")

    assert response.status_code == 403
    assert response["content-type"] == "application/json"
    assert "CSRF" in response.json()["detail"]
