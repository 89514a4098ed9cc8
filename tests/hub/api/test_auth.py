"""API tokens: their format, storage, authentication and the endpoints to manage them."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from hub.accounts.api_tokens import authenticate_api_token, create_api_token, revoke_api_token
from hub.accounts.models import ApiToken, User
from hub.lib import tokens
from hub.lib.redact import redact
from tests.hub import factories as f
from tests.hub.api.conftest import client_for

pytestmark = pytest.mark.django_db


def test_a_token_is_cgpr_and_36_base62_and_only_its_digest_is_stored(renter: User) -> None:
    token, plaintext = create_api_token(renter, "laptop")
    assert plaintext.startswith("cgpr_")
    assert len(plaintext) == 41
    assert tokens.well_formed(plaintext, "cgpr_")
    assert not tokens.well_formed(plaintext)  # not an agent token
    stored = ApiToken.objects.get(pk=token.pk)
    assert stored.digest == tokens.digest(plaintext)
    assert stored.prefix == plaintext[:11]
    assert plaintext not in {v for v in vars(stored).values() if isinstance(v, str)}


def test_logs_never_show_an_api_token(renter: User) -> None:
    _, plaintext = create_api_token(renter)
    assert plaintext not in redact(f"GET /x Authorization: Bearer {plaintext}")
    assert "cgpr_[redacted]" in redact(f"token={plaintext[:4]}%5F{plaintext[5:]} rest")


def _status(client: APIClient) -> int:
    return client.get("/api/v1/account/").status_code


def test_a_valid_token_authenticates_and_records_its_use(renter: User) -> None:
    token, plaintext = create_api_token(renter)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    response = client.get("/api/v1/account/")
    assert response.status_code == 200
    assert response.json()["username"] == renter.username
    token.refresh_from_db()
    assert token.last_used_at is not None


@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer cgpr_" + "a" * 36,  # well formed, bad checksum
        "Bearer cgpr_",
        "Bearer",
        "Bearer two words",
        "Token abc",
    ],
)
def test_missing_or_wrong_credentials_are_401(header: str | None) -> None:
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/v1/leases/")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert response.json()["detail"]


def test_an_unknown_but_well_formed_token_is_401(renter: User) -> None:
    _, plaintext = create_api_token(renter)
    ApiToken.objects.all().delete()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert _status(client) == 401


def test_a_revoked_token_is_401_and_only_its_owner_can_revoke_it(renter: User) -> None:
    token, plaintext = create_api_token(renter)
    assert not revoke_api_token(f.make_user(), token.pk)
    assert authenticate_api_token(plaintext) is not None
    assert revoke_api_token(renter, token.pk)
    assert authenticate_api_token(plaintext) is None
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    assert _status(client) == 401


def test_an_inactive_user_s_token_is_401(renter: User) -> None:
    client = client_for(renter)
    User.objects.filter(pk=renter.pk).update(is_active=False)
    assert _status(client) == 401


def test_the_session_works_too_with_csrf(renter: User) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(renter)
    assert client.get("/api/v1/tokens/").status_code == 200
    # A logged-in browser without the CSRF token cannot be made to write.
    assert client.post("/api/v1/tokens/", {"name": "x"}, format="json").status_code == 403


def test_a_renter_lists_creates_and_revokes_their_tokens(renter: User) -> None:
    api = client_for(renter, ["read", "leases", "tokens"])
    created = api.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    assert created.status_code == 201
    body = created.json()
    assert body["token"].startswith("cgpr_")
    assert body["name"] == "ci"
    assert body["active"]
    assert body["scopes"] == ["read", "leases"]  # the default, not the creator's `tokens`

    listed = api.get("/api/v1/tokens/").json()
    assert [t["name"] for t in listed] == ["ci", "tests"]
    assert all("token" not in t and "digest" not in t for t in listed)

    other = client_for(f.make_user(), ["read", "leases", "tokens"])
    assert other.delete(f"/api/v1/tokens/{body['id']}/").status_code == 404
    assert api.delete(f"/api/v1/tokens/{body['id']}/").status_code == 204
    fresh = APIClient()
    fresh.credentials(HTTP_AUTHORIZATION=f"Bearer {body['token']}")
    assert _status(fresh) == 401
    revoked = next(t for t in api.get("/api/v1/tokens/").json() if t["id"] == body["id"])
    assert revoked["revoked_at"]
    assert not revoked["active"]


def test_a_token_name_that_is_too_long_is_400(renter: User) -> None:
    api = client_for(renter, ["read", "leases", "tokens"])
    response = api.post("/api/v1/tokens/", {"name": "x" * 101}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("name:")
