"""/api/v1/ssh-keys/: list, add (checked), delete; scopes; another renter's key is a 404."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.accounts.models import SshKey, User
from tests.hub import factories as f
from tests.hub.accounts.test_ssh_keys import keygen
from tests.hub.api.conftest import client_for

pytestmark = pytest.mark.django_db


def test_add_list_and_delete_a_key(renter: User, tmp_path: Path) -> None:
    api = client_for(renter)
    line = keygen(tmp_path, comment="laptop")
    added = api.post("/api/v1/ssh-keys/", {"public_key": f"{line}\n"}, format="json")
    assert added.status_code == 201, added.json()
    body = added.json()
    assert body["public_key"] == line
    assert body["comment"] == "laptop"
    assert body["fingerprint"].startswith("SHA256:")
    listed = api.get("/api/v1/ssh-keys/").json()
    assert [k["id"] for k in listed] == [body["id"]]
    assert api.delete(f"/api/v1/ssh-keys/{body['id']}/").status_code == 204
    assert api.get("/api/v1/ssh-keys/").json() == []
    assert api.delete(f"/api/v1/ssh-keys/{body['id']}/").status_code == 404


def test_refusals_are_400_with_a_sentence(renter: User, tmp_path: Path) -> None:
    api = client_for(renter)
    short = api.post(
        "/api/v1/ssh-keys/", {"public_key": keygen(tmp_path, "rsa", 1024)}, format="json"
    )
    assert short.status_code == 400
    assert "at least 2048" in short.json()["detail"]
    line = keygen(tmp_path)
    assert api.post("/api/v1/ssh-keys/", {"public_key": line}, format="json").status_code == 201
    again = api.post("/api/v1/ssh-keys/", {"public_key": line}, format="json")
    assert again.status_code == 400
    assert "already added" in again.json()["detail"]


def test_another_renter_s_key_is_not_found_and_not_listed(renter: User, tmp_path: Path) -> None:
    other = f.make_user("renter")
    client_for(other).post("/api/v1/ssh-keys/", {"public_key": keygen(tmp_path)}, format="json")
    key = SshKey.objects.get(user=other)
    api = client_for(renter)
    assert api.get("/api/v1/ssh-keys/").json() == []
    assert api.delete(f"/api/v1/ssh-keys/{key.pk}/").status_code == 404
    assert SshKey.objects.filter(pk=key.pk).exists()


def test_a_read_only_token_lists_but_cannot_add_or_delete(renter: User, tmp_path: Path) -> None:
    client_for(renter).post("/api/v1/ssh-keys/", {"public_key": keygen(tmp_path)}, format="json")
    key = SshKey.objects.get(user=renter)
    reader = client_for(renter, ["read"])
    assert reader.get("/api/v1/ssh-keys/").status_code == 200
    refused = reader.post("/api/v1/ssh-keys/", {"public_key": keygen(tmp_path)}, format="json")
    assert refused.status_code == 403
    assert "'leases' scope" in refused.json()["detail"]
    assert reader.delete(f"/api/v1/ssh-keys/{key.pk}/").status_code == 403
    assert client_for(renter, ["leases"]).get("/api/v1/ssh-keys/").status_code == 403


def test_the_schema_describes_the_endpoints_and_the_lease_s_ssh(renter: User) -> None:
    schema = client_for(renter).get("/api/schema/?format=json").json()
    paths = schema["paths"]
    assert paths["/api/v1/ssh-keys/"]["post"]["x-required-scope"] == "leases"
    assert paths["/api/v1/ssh-keys/"]["get"]["x-required-scope"] == "read"
    assert paths["/api/v1/ssh-keys/{id}/"]["delete"]["x-required-scope"] == "leases"
    assert "ssh" in schema["components"]["schemas"]["Lease"]["properties"]
