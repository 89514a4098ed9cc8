"""The admin shows an API token's scopes, never its digest, and cannot add one."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from hub.accounts.api_tokens import create_api_token
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


def test_the_admin_lists_and_shows_a_token_s_scopes(admin_client: Client) -> None:
    token, _ = create_api_token(f.make_user("renter"), "cli", ["read", "tokens"])
    changelist = admin_client.get(reverse("admin:accounts_apitoken_changelist")).content.decode()
    change = admin_client.get(reverse("admin:accounts_apitoken_change", args=[token.pk]))
    assert "read, tokens" in changelist
    assert "read, tokens" in change.content.decode()
    assert token.digest not in changelist + change.content.decode()
    assert admin_client.get(reverse("admin:accounts_apitoken_add")).status_code == 403
