"""The SSH keys page: add (refusals shown), list, delete; private to its owner; in the nav."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from hub.accounts.models import SshKey, User
from tests.hub import factories as f
from tests.hub.accounts.test_ssh_keys import keygen

pytestmark = pytest.mark.django_db


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_add_list_and_delete_a_key_from_the_page(tmp_path: Path) -> None:
    renter = f.make_user("renter")
    client = _client(renter)
    home = client.get(reverse("web:offers")).content.decode()
    assert f'href="{reverse("web:ssh-keys")}"' in home  # in the nav
    line = keygen(tmp_path, comment="work-laptop")
    page = client.post(reverse("web:ssh-keys"), {"key": line}, follow=True).content.decode()
    key = SshKey.objects.get(user=renter)
    assert key.fingerprint in page
    assert "work-laptop" in page
    refused = client.post(reverse("web:ssh-keys"), {"key": keygen(tmp_path, "rsa", 1024)})
    assert refused.status_code == 400
    assert "at least 2048" in refused.content.decode()
    client.post(reverse("web:ssh-key-delete", args=[key.pk]))
    assert not SshKey.objects.filter(pk=key.pk).exists()


def test_another_person_neither_sees_nor_deletes_a_key_and_csrf_is_needed(tmp_path: Path) -> None:
    owner, other = f.make_user("renter"), f.make_user("renter")
    _client(owner).post(reverse("web:ssh-keys"), {"key": keygen(tmp_path)})
    key = SshKey.objects.get(user=owner)
    assert key.fingerprint not in _client(other).get(reverse("web:ssh-keys")).content.decode()
    assert _client(other).post(reverse("web:ssh-key-delete", args=[key.pk])).status_code == 404
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(owner)
    assert strict.post(reverse("web:ssh-key-delete", args=[key.pk])).status_code == 403
    assert SshKey.objects.filter(pk=key.pk).exists()


def test_the_page_has_no_inline_script() -> None:
    page = _client(f.make_user("renter")).get(reverse("web:ssh-keys")).content.decode()
    assert "<script>" not in page
    assert " on" + "click=" not in page
