"""Renters' SSH public keys: what is accepted (real ssh-keygen output), what is refused and
why, no duplicates (across accounts too), the cap, deleting."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import pytest

from hub.accounts.models import SshKey
from hub.accounts.ssh_keys import MAX_PER_ACCOUNT, SshKeyError, add_ssh_key, delete_ssh_key
from hub.lib.ssh_keys import BadPublicKey, fingerprint, parse_public_key
from tests.hub import factories as f


def keygen(
    folder: Path, key_type: str = "ed25519", bits: int | None = None, comment: str = "me@laptop"
) -> str:
    path = folder / f"id_{key_type}_{bits or 0}_{len(list(folder.iterdir()))}"
    argv = ["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)]
    if bits:
        argv += ["-b", str(bits)]
    subprocess.run(argv, check=True, timeout=60, capture_output=True)
    return path.with_name(path.name + ".pub").read_text().strip()


def ssh_keygen_fingerprint(line: str, folder: Path) -> str:
    path = folder / "fp.pub"
    path.write_text(line + "\n")
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(path)],
        check=True, capture_output=True, text=True, timeout=30,
    ).stdout  # fmt: skip
    return out.split()[1]


# --- parsing (no database) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key_type", "bits"),
    [("ed25519", None), ("ecdsa", 256), ("ecdsa", 384), ("ecdsa", 521), ("rsa", 2048)],
)
def test_keys_ssh_keygen_makes_are_accepted_comment_kept_fingerprint_as_openssh(
    tmp_path: Path, key_type: str, bits: int | None
) -> None:
    line = keygen(tmp_path, key_type, bits, comment="alice@laptop 2026")
    key = parse_public_key(f"  {line}\n")
    assert key.line == line
    assert key.comment == "alice@laptop 2026"
    assert key.fingerprint == ssh_keygen_fingerprint(line, tmp_path)


def test_a_short_rsa_key_is_refused_saying_how_many_bits(tmp_path: Path) -> None:
    with pytest.raises(BadPublicKey, match="1024 bits; at least 2048"):
        parse_public_key(keygen(tmp_path, "rsa", 1024))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "paste a public key"),
        ("ssh-dss AAAAB3NzaC1kc3MAAACBAP", "is not accepted"),
        ("-----BEGIN OPENSSH PRIVATE KEY-----", "private key"),
        ("ssh-ed25519", "<type> <base64>"),
        ("ssh-ed25519 not*base64", "not valid base64"),
    ],
)
def test_what_is_not_a_usable_key_is_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(BadPublicKey, match=why.replace("*", r"\*")):
        parse_public_key(text)


def test_a_cut_paste_a_type_mismatch_and_a_bad_comment_are_refused(tmp_path: Path) -> None:
    key_type, blob, _ = keygen(tmp_path).split(" ", 2)
    raw = base64.b64decode(blob)
    cut = base64.b64encode(raw[:-5]).decode()
    with pytest.raises(BadPublicKey, match=r"cut short|wrong size"):
        parse_public_key(f"{key_type} {cut}")
    with pytest.raises(BadPublicKey, match="not a ssh-rsa key"):
        parse_public_key(f"ssh-rsa {blob}")
    with pytest.raises(BadPublicKey, match="printable ASCII"):
        parse_public_key(f"{key_type} {blob} evil\x1bcomment")
    with pytest.raises(BadPublicKey, match="one line"):
        parse_public_key(f"{key_type} {blob}\n{key_type} {blob}")
    assert fingerprint(blob) == parse_public_key(f"{key_type} {blob}").fingerprint


# --- the account's keys (database) ----------------------------------------------------------


@pytest.mark.django_db
def test_add_keeps_the_key_and_refuses_it_again_on_any_account(tmp_path: Path) -> None:
    alice, bob = f.make_user("renter"), f.make_user("renter")
    line = keygen(tmp_path)
    key = add_ssh_key(alice, line)
    assert (key.user, key.line) == (alice, line)
    with pytest.raises(SshKeyError, match="already added"):
        add_ssh_key(alice, line)
    # One key opens one account's rentals: the same key on another account is refused too.
    with pytest.raises(SshKeyError, match="already added"):
        add_ssh_key(bob, line.rsplit(" ", 1)[0] + " another-comment")
    assert SshKey.objects.count() == 1


@pytest.mark.django_db
def test_an_account_holds_at_most_the_cap(tmp_path: Path) -> None:
    renter = f.make_user("renter")
    for _ in range(MAX_PER_ACCOUNT):
        add_ssh_key(renter, keygen(tmp_path))
    with pytest.raises(SshKeyError, match=f"at most {MAX_PER_ACCOUNT}"):
        add_ssh_key(renter, keygen(tmp_path))
    # Another account is not affected by this one's cap.
    add_ssh_key(f.make_user("renter"), keygen(tmp_path))


@pytest.mark.django_db
def test_delete_removes_only_the_owner_s_key(tmp_path: Path) -> None:
    owner, other = f.make_user("renter"), f.make_user("renter")
    key = add_ssh_key(owner, keygen(tmp_path))
    assert not delete_ssh_key(other, key.pk)
    assert SshKey.objects.filter(pk=key.pk).exists()
    assert delete_ssh_key(owner, key.pk)
    assert not SshKey.objects.filter(pk=key.pk).exists()
    assert not delete_ssh_key(owner, key.pk)
