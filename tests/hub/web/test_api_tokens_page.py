"""The renter's API token page: shown once, works against the API, revocable, private."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from hub.accounts.models import ApiToken
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_new_api_token_is_shown_once_works_and_can_be_revoked() -> None:
    renter = f.make_user("renter")
    client = _client(renter)
    page = client.post(reverse("web:api-tokens"), {"name": "ci"}, follow=True).content.decode()
    (plaintext,) = set(re.findall(r"cgpr_[0-9A-Za-z]{36}", page))
    assert plaintext not in client.get(reverse("web:api-tokens")).content.decode()

    api = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    account = api.get("/api/v1/account/")
    assert account.status_code == 200
    assert account.json()["username"] == renter.username

    token = ApiToken.objects.get(user=renter)
    client.post(reverse("web:api-token-revoke", args=[token.pk]))
    assert api.get("/api/v1/account/").status_code == 401


def test_another_person_cannot_revoke_a_token_and_needs_csrf() -> None:
    owner, other = f.make_user("renter"), f.make_user("renter")
    _client(owner).post(reverse("web:api-tokens"), {"name": "mine"})
    token = ApiToken.objects.get(user=owner)
    response = _client(other).post(reverse("web:api-token-revoke", args=[token.pk]))
    assert response.status_code == 404
    assert "mine" not in _client(other).get(reverse("web:api-tokens")).content.decode()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(reverse("web:api-token-revoke", args=[token.pk])).status_code == 403
    token.refresh_from_db()
    assert token.revoked_at is None
