"""The renter's API token page: shown once, works against the API, revocable, private."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from hub.accounts.api_tokens import create_api_token
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
    page = client.post(
        reverse("web:api-tokens"), {"name": "ci", "scopes": ["read", "leases"]}, follow=True
    ).content.decode()
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
    _client(owner).post(reverse("web:api-tokens"), {"name": "mine", "scopes": ["read"]})
    token = ApiToken.objects.get(user=owner)
    response = _client(other).post(reverse("web:api-token-revoke", args=[token.pk]))
    assert response.status_code == 404
    assert "mine" not in _client(other).get(reverse("web:api-tokens")).content.decode()
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(reverse("web:api-token-revoke", args=[token.pk])).status_code == 403
    token.refresh_from_db()
    assert token.revoked_at is None


def test_the_form_pre_checks_read_and_leases_only() -> None:
    page = _client(f.make_user("renter")).get(reverse("web:api-tokens")).content.decode()
    boxes = dict(re.findall(r'<input type="checkbox" name="scopes" value="(\w+)"([^>]*)>', page))
    assert sorted(boxes) == ["hosts", "leases", "payouts", "read", "tokens"]
    assert "checked" in boxes["read"]
    assert "checked" in boxes["leases"]
    assert "checked" not in boxes["tokens"]
    assert "checked" not in boxes["payouts"]  # opt-in: it asks for money to leave
    assert "checked" not in boxes["hosts"]  # opt-in: it reprices the supplier's GPUs


@pytest.mark.parametrize(
    ("scopes", "read", "mint"), [(["read"], 200, 403), (["read", "tokens"], 200, 201)]
)
def test_a_token_gets_the_checked_scopes_and_the_list_shows_them(
    scopes: list[str], read: int, mint: int
) -> None:
    renter = f.make_user("renter")
    client = _client(renter)
    page = client.post(reverse("web:api-tokens"), {"name": "cli", "scopes": scopes}).content
    (plaintext,) = set(re.findall(r"cgpr_[0-9A-Za-z]{36}", page.decode()))
    assert ApiToken.objects.get(user=renter).scopes == scopes

    api = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert api.get("/api/v1/account/").status_code == read
    minted = api.post("/api/v1/tokens/", {"scopes": ["read"]}, content_type="application/json")
    assert minted.status_code == mint
    listed = client.get(reverse("web:api-tokens")).content.decode()
    assert f'<td class="scopes">{", ".join(scopes)}</td>' in listed


@pytest.mark.parametrize("scopes", [[], ["root"], ["read", "admin"]])
def test_no_or_unknown_scopes_create_no_token(scopes: list[str]) -> None:
    renter = f.make_user("renter")
    response = _client(renter).post(reverse("web:api-tokens"), {"name": "x", "scopes": scopes})
    assert response.status_code == 200
    assert 'class="errorlist"' in response.content.decode()
    assert "cgpr_" not in response.content.decode()
    assert not ApiToken.objects.filter(user=renter).exists()


def test_revoking_a_leaked_token_on_the_dashboard_ends_its_access_at_once() -> None:
    renter = f.make_user("renter")
    token, plaintext = create_api_token(renter, "leaked", ["read", "leases", "tokens"])
    leaked = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    successor = leaked.post(
        "/api/v1/tokens/", {"name": "successor"}, content_type="application/json"
    ).json()
    # What the thief minted shows on the owner's page, so it can be revoked too.
    owner = _client(renter)
    assert "successor" in owner.get(reverse("web:api-tokens")).content.decode()

    owner.post(reverse("web:api-token-revoke", args=[token.pk]))
    owner.post(reverse("web:api-token-revoke", args=[successor["id"]]))

    thief = Client(HTTP_AUTHORIZATION=f"Bearer {successor['token']}")
    for client in (leaked, thief):
        assert client.get("/api/v1/account/").status_code == 401
        minted = client.post("/api/v1/tokens/", {}, content_type="application/json")
        assert minted.status_code == 401
    assert not ApiToken.objects.filter(user=renter, revoked_at__isnull=True).exists()
