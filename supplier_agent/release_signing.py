"""Signed agent releases: Ed25519 signatures over what a release is (issue 37).

A release folder holds one wheel and its ``release.json``: version, file name, sha256, the
keys the next releases may be signed with (``next_keys``), and signatures. The private key is
kept away from the hub (an operator's machine, a hardware token's export): the hub only
serves the signed folder, so whoever takes the hub over still cannot hand suppliers an agent
of their own. An agent pins the public keys at install (``configure --release-key``) and
``upgrade`` refuses a release that no pinned key signed, before downloading it; the wheel
then must match the signed sha256.

Key rotation: a release signed by a pinned key may name ``next_keys``; an agent that installs
it pins those too, so later releases can be signed by the new key, and the old one can be
retired once every host has taken that release.

The signed bytes are a fixed context line and the compact, sorted JSON of version, filename,
sha256 and next_keys (never the URL, which is the hub's to choose). Keys are written
``ed25519:<base64url of the 32 raw bytes>``.

Operators use it as ``python -m supplier_agent.release_signing keygen|sign|verify``
(docs/operators.md, "Signing agent releases"). ``cryptography`` does the Ed25519 arithmetic.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

CONTEXT = b"cloudgpu-agent-release-v1\n"
KEY_PREFIX = "ed25519:"
MAX_KEYS = 8
RELEASE_FILE = "release.json"
_WHEEL = re.compile(r"^cloudgpu_agent-([0-9][0-9A-Za-z.+!_]*)-[0-9A-Za-z._-]+\.whl$")


class SignatureError(ValueError):
    """A key, signature or release that does not check out; the message says which."""


def _b64decode(text: str) -> bytes:
    try:
        # validate: the lenient default would drop characters outside the alphabet.
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"not base64: {text[:20]!r}") from None


def parse_public_key(text: str) -> Ed25519PublicKey:
    text = text.strip()
    if not text.startswith(KEY_PREFIX):
        raise SignatureError(f"a release key starts with {KEY_PREFIX!r}: {text[:30]!r}")
    raw = _b64decode(text.removeprefix(KEY_PREFIX))
    if len(raw) != 32:
        raise SignatureError(f"an Ed25519 key is 32 bytes, not {len(raw)}: {text[:30]!r}")
    return Ed25519PublicKey.from_public_bytes(raw)


def public_key_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return KEY_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def key_id(text: str) -> str:
    """A short name for a key in messages: the first 16 hex digits of its sha256."""
    raw = parse_public_key(text).public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    return hashlib.sha256(raw).hexdigest()[:16]


def parse_keys(texts: Iterable[str]) -> tuple[str, ...]:
    """Checked, normalised and without repeats; at most MAX_KEYS."""
    keys: list[str] = []
    for text in texts:
        if not text.strip():
            continue
        normal = public_key_text(parse_public_key(text))
        if normal not in keys:
            keys.append(normal)
    if len(keys) > MAX_KEYS:
        raise SignatureError(f"at most {MAX_KEYS} release keys")
    return tuple(keys)


def statement(version: str, filename: str, sha256: str, next_keys: Sequence[str]) -> bytes:
    body = {
        "filename": filename,
        "next_keys": list(next_keys),
        "sha256": sha256,
        "version": version,
    }
    return CONTEXT + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def verify(
    version: str,
    filename: str,
    sha256: str,
    next_keys: Sequence[str],
    signatures: Sequence[dict[str, str]],
    trusted: Sequence[str],
) -> str:
    """The pinned key that signed this release; SignatureError (saying why) if none did."""
    if not signatures:
        raise SignatureError("the release is not signed")
    signed = statement(version, filename, sha256, next_keys)
    trusted_set = set(parse_keys(trusted))
    strangers: list[str] = []
    for entry in signatures[:MAX_KEYS]:
        key, sig = entry.get("key", ""), entry.get("sig", "")
        try:
            normal = public_key_text(parse_public_key(key))
        except SignatureError:
            continue
        if normal not in trusted_set:
            strangers.append(key_id(normal))
            continue
        try:
            parse_public_key(normal).verify(_b64decode(sig), signed)
        except (InvalidSignature, SignatureError):
            raise SignatureError(
                f"the signature by key {key_id(normal)} does not match this release (tampered "
                "with, or signed for another)"
            ) from None
        return normal
    named = f" (signed by {', '.join(strangers)})" if strangers else ""
    pinned = ", ".join(key_id(k) for k in trusted_set)
    raise SignatureError(
        f"no key this agent trusts signed the release{named}; pinned: {pinned or 'none'}"
    )


def sign(
    private: Ed25519PrivateKey, version: str, filename: str, sha256: str, next_keys: Sequence[str]
) -> dict[str, str]:
    sig = private.sign(statement(version, filename, sha256, next_keys))
    return {
        "key": public_key_text(private.public_key()),
        "sig": base64.urlsafe_b64encode(sig).decode().rstrip("="),
    }


def load_private_key(path: Path) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{path} is not an Ed25519 private key")
    return key


def write_private_key(path: Path) -> Ed25519PrivateKey:
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return key


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def describe_wheel(wheel: Path) -> dict[str, Any]:
    match = _WHEEL.match(wheel.name)
    if match is None:
        raise SignatureError(f"{wheel.name} is not an agent wheel's name")
    return {"version": match.group(1), "filename": wheel.name, "sha256": _sha256_of(wheel)}


def sign_release(
    wheel: Path, private: Ed25519PrivateKey, next_keys: Sequence[str] = ()
) -> dict[str, Any]:
    """The signed release description of ``wheel`` (its URL: the file's name, beside it)."""
    fields = describe_wheel(wheel)
    keys = list(parse_keys(next_keys))
    signature = sign(private, fields["version"], fields["filename"], fields["sha256"], keys)
    return {**fields, "url": fields["filename"], "next_keys": keys, "signatures": [signature]}


def _folder_wheel(folder: Path) -> Path:
    wheels = sorted(folder.glob("cloudgpu_agent-*.whl"))
    if len(wheels) != 1:
        raise SignatureError(f"{folder} must hold exactly one agent wheel, not {len(wheels)}")
    return wheels[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m supplier_agent.release_signing",
        description="Sign agent releases with an Ed25519 key kept away from the hub.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    keygen = commands.add_parser(
        "keygen", help="make a private key (0600) and print its public key"
    )
    keygen.add_argument("key_file", help="where to write the private key; never on the hub")
    signing = commands.add_parser("sign", help="write FOLDER/release.json for the wheel in it")
    signing.add_argument("folder", help="a folder holding one cloudgpu_agent wheel")
    signing.add_argument("--key", required=True, help="the private key file")
    signing.add_argument(
        "--next-key",
        action="append",
        default=[],
        help="a public key later releases may be signed with (repeat for several)",
    )
    checker = commands.add_parser("verify", help="check FOLDER/release.json and its wheel")
    checker.add_argument("folder")
    checker.add_argument("--key", action="append", required=True, help="a trusted public key")
    args = parser.parse_args(argv)
    try:
        if args.command == "keygen":
            key = write_private_key(Path(args.key_file))
            print(public_key_text(key.public_key()))
            return 0
        folder = Path(args.folder)
        wheel = _folder_wheel(folder)
        if args.command == "sign":
            release = sign_release(wheel, load_private_key(Path(args.key)), args.next_key)
            (folder / RELEASE_FILE).write_text(json.dumps(release, indent=2) + "\n")
            signer = key_id(release["signatures"][0]["key"])
            print(f"signed {wheel.name} ({release['version']}) with key {signer}")
            return 0
        release = json.loads((folder / RELEASE_FILE).read_text())
        actual = describe_wheel(wheel)
        if actual["sha256"] != release.get("sha256") or actual["filename"] != release.get(
            "filename"
        ):
            raise SignatureError(f"{wheel.name} is not the wheel {RELEASE_FILE} describes")
        used = verify(
            release["version"],
            release["filename"],
            release["sha256"],
            release.get("next_keys", []),
            release.get("signatures", []),
            args.key,
        )
        print(f"{wheel.name}: signed by {key_id(used)}")
        return 0
    except (SignatureError, OSError, ValueError, KeyError) as exc:
        print(f"release_signing: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
