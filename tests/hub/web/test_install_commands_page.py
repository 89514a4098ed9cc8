"""The supplier's install commands: the one-liner carries a single-use code, never a token,
and is shown once; a waiting code can be cancelled by its owner only."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from django.urls import reverse

from hub.installer.models import EnrollmentCode
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

CODE_RE = re.compile(r"cgpe_[0-9A-Za-z]{36}")


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_an_install_command_carries_a_code_shown_once_and_no_token(settings: Any) -> None:
    settings.HUB_PUBLIC_URL = "https://hub.example.com"
    supplier = f.make_user("supplier")
    client = _client(supplier)

    response = client.post(reverse("web:install-command-create"), {"enroll-name": "rig-4"})

    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    body = response.content.decode()
    (code,) = set(CODE_RE.findall(body))
    assert f"curl -fsSL https://hub.example.com/install.sh | sudo bash -s {code}" in body
    assert "cgpu_" not in body
    row = EnrollmentCode.objects.get(owner=supplier)
    assert row.name == "rig-4"
    assert row.prefix == code[:11]

    later = client.get(reverse("web:tokens")).content.decode()
    assert code not in later
    assert row.prefix in later  # listed as waiting, by its visible start only
    for session in Session.objects.all():
        assert code not in str(session.get_decoded())


def test_a_new_token_is_shown_with_an_installer_that_asks_for_it() -> None:
    client = _client(f.make_user("supplier"))
    body = client.post(reverse("web:tokens"), {"name": "manual"}).content.decode()
    (token,) = set(re.findall(r"cgpu_[0-9A-Za-z]{36}", body))
    assert "/install.sh | sudo bash<" in body
    assert f"bash -s {token}" not in body
    assert body.count(token) == 1


def test_a_waiting_code_is_cancelled_by_its_owner_only() -> None:
    owner, other = f.make_user("supplier"), f.make_user("supplier")
    _client(owner).post(reverse("web:install-command-create"), {"enroll-name": "x"})
    code = EnrollmentCode.objects.get(owner=owner)
    cancel = reverse("web:install-command-cancel", args=[code.pk])

    assert _client(other).post(cancel).status_code == 404
    code.refresh_from_db()
    assert code.revoked_at is None
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(cancel).status_code == 403

    response = _client(owner).post(cancel, follow=True)

    assert "cancelled" in response.content.decode()
    code.refresh_from_db()
    assert code.revoked_at is not None
    assert code.prefix not in _client(owner).get(reverse("web:tokens")).content.decode()


def test_creating_an_install_command_needs_a_login_and_a_post() -> None:
    url = reverse("web:install-command-create")
    assert Client().post(url).status_code == 302
    assert _client(f.make_user("supplier")).get(url).status_code == 405
    assert not EnrollmentCode.objects.exists()
