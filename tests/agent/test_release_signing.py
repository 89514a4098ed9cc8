"""supplier_agent/release_signing.py: what a signature binds, which keys count, the key format,
and the operators' command (keygen, sign, verify) run as documented."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from supplier_agent import release_signing as rs

VERSION, FILENAME, SHA = "1.2.3", "cloudgpu_agent-1.2.3-py3-none-any.whl", "ab" * 32


def _pub(key: Ed25519PrivateKey) -> str:
    return rs.public_key_text(key.public_key())


def test_a_signature_binds_version_file_digest_and_next_keys() -> None:
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    nxt = [_pub(other)]
    signature = rs.sign(key, VERSION, FILENAME, SHA, nxt)
    assert rs.verify(VERSION, FILENAME, SHA, nxt, [signature], [_pub(key)]) == _pub(key)
    for changed in (
        ("1.2.4", FILENAME, SHA, nxt),
        (VERSION, FILENAME.replace("1.2.3", "1.2.4"), SHA, nxt),
        (VERSION, FILENAME, "cd" * 32, nxt),
        (VERSION, FILENAME, SHA, []),  # a key slipped in or out of the rotation
    ):
        with pytest.raises(rs.SignatureError, match="does not match this release"):
            rs.verify(*changed, [signature], [_pub(key)])


def test_only_a_pinned_key_counts() -> None:
    key, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    theirs = rs.sign(stranger, VERSION, FILENAME, SHA, [])
    with pytest.raises(rs.SignatureError, match=f"signed by {rs.key_id(_pub(stranger))}"):
        rs.verify(VERSION, FILENAME, SHA, [], [theirs], [_pub(key)])
    # A signature claiming a pinned key but made by another one is a mismatch, not a pass.
    forged = {"key": _pub(key), "sig": theirs["sig"]}
    with pytest.raises(rs.SignatureError, match="does not match"):
        rs.verify(VERSION, FILENAME, SHA, [], [forged], [_pub(key)])
    with pytest.raises(rs.SignatureError, match="not signed"):
        rs.verify(VERSION, FILENAME, SHA, [], [], [_pub(key)])
    # One good signature among strangers' is enough (a release signed by the old and new key).
    mine = rs.sign(key, VERSION, FILENAME, SHA, [])
    assert rs.verify(VERSION, FILENAME, SHA, [], [theirs, mine], [_pub(key)]) == _pub(key)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("ssh-ed25519 AAAA", "starts with 'ed25519:'"),
        ("ed25519:!!!", "not base64"),
        ("ed25519:AAAA", "32 bytes, not 3"),
    ],
)
def test_bad_keys_are_named(text: str, why: str) -> None:
    with pytest.raises(rs.SignatureError, match=why):
        rs.parse_public_key(text)


def test_keys_are_normalised_deduplicated_and_bounded() -> None:
    key = _pub(Ed25519PrivateKey.generate())
    assert rs.parse_keys([key, f" {key} ", "", key + "="]) == (key,)
    many = [_pub(Ed25519PrivateKey.generate()) for _ in range(rs.MAX_KEYS + 1)]
    with pytest.raises(rs.SignatureError, match="at most"):
        rs.parse_keys(many)


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supplier_agent.release_signing", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_operators_command_makes_keys_signs_a_folder_and_verifies_it(tmp_path: Path) -> None:
    folder = tmp_path / "release"
    folder.mkdir()
    wheel = folder / FILENAME
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("supplier_agent/__init__.py", '__version__ = "1.2.3"\n')
    made = _tool("keygen", str(tmp_path / "key.pem"))
    assert made.returncode == 0, made.stderr
    public = made.stdout.strip()
    assert public.startswith("ed25519:")
    assert (tmp_path / "key.pem").stat().st_mode & 0o777 == 0o600
    assert _tool("keygen", str(tmp_path / "key.pem")).returncode == 1  # never overwritten
    nxt = _pub(Ed25519PrivateKey.generate())
    signed = _tool("sign", str(folder), "--key", str(tmp_path / "key.pem"), "--next-key", nxt)
    assert signed.returncode == 0, signed.stderr
    release = json.loads((folder / "release.json").read_text())
    assert (release["version"], release["filename"], release["url"]) == (
        VERSION,
        FILENAME,
        FILENAME,
    )
    assert release["next_keys"] == [nxt]
    ok = _tool("verify", str(folder), "--key", public)
    assert ok.returncode == 0, ok.stderr
    assert f"signed by {rs.key_id(public)}" in ok.stdout
    assert _tool("verify", str(folder), "--key", nxt).returncode == 1
    wheel.write_bytes(wheel.read_bytes() + b"\0")  # the wheel changed after signing
    changed = _tool("verify", str(folder), "--key", public)
    assert changed.returncode == 1
    assert "is not the wheel release.json describes" in changed.stderr
