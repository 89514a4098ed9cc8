"""Agent token format: ``cgpu_<30 random base62><6 base62 CRC32 checksum>``.

The prefix lets secret scanners spot a leaked token; the checksum lets us (and them) reject a
mistyped or made-up token without a database lookup. Only a SHA-256 digest is stored.
"""

from __future__ import annotations

import hashlib
import secrets
import string
import zlib

PREFIX = "cgpu_"
_ALPHABET = string.digits + string.ascii_letters
_RANDOM_LEN = 30  # ~178 bits
_CHECKSUM_LEN = 6
TOKEN_LEN = len(PREFIX) + _RANDOM_LEN + _CHECKSUM_LEN
VISIBLE_PREFIX_LEN = len(PREFIX) + 6


def _base62(number: int, width: int) -> str:
    digits = []
    for _ in range(width):
        number, remainder = divmod(number, 62)
        digits.append(_ALPHABET[remainder])
    return "".join(reversed(digits))


def _checksum(body: str) -> str:
    return _base62(zlib.crc32(body.encode("ascii")), _CHECKSUM_LEN)


def generate_token(prefix: str = PREFIX) -> str:
    """A new token; other credentials (renters' ``cgpr_`` API tokens) share the format with
    their own five-character prefix."""
    body = "".join(secrets.choice(_ALPHABET) for _ in range(_RANDOM_LEN))
    return f"{prefix}{body}{_checksum(body)}"


def well_formed(token: str, prefix: str = PREFIX) -> bool:
    """Prefix, length, alphabet and checksum all right (says nothing about validity)."""
    if len(token) != len(prefix) + _RANDOM_LEN + _CHECKSUM_LEN or not token.startswith(prefix):
        return False
    rest = token[len(prefix) :]
    if any(c not in _ALPHABET for c in rest):
        return False
    body, checksum = rest[:_RANDOM_LEN], rest[_RANDOM_LEN:]
    return secrets.compare_digest(_checksum(body), checksum)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def visible_prefix(token: str) -> str:
    return token[:VISIBLE_PREFIX_LEN]
