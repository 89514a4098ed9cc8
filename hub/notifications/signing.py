"""How a delivery is signed, the scheme Stripe and GitHub use: HMAC-SHA256 with the endpoint's
secret over ``<timestamp>.<body>``, sent as ``CloudGPU-Signature: t=<timestamp>,v1=<hex>``.
A receiver recomputes it over the raw body, compares in constant time, and refuses a
timestamp older than a few minutes (replays). docs/webhooks.md shows the check in Python."""

from __future__ import annotations

import hashlib
import hmac
import secrets

SIGNATURE_HEADER = "CloudGPU-Signature"
SECRET_PREFIX = "whsec_"  # noqa: S105  # a prefix, not a secret


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    signed = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def header(secret: str, timestamp: int, body: bytes) -> str:
    return f"t={timestamp},v1={signature(secret, timestamp, body)}"


def verify(secret: str, header_value: str, body: bytes, now: int, tolerance_s: int = 300) -> bool:
    """What a receiver does (and the tests check deliveries with)."""
    fields: dict[str, list[str]] = {}
    for part in header_value.split(","):
        key, _, value = part.strip().partition("=")
        fields.setdefault(key, []).append(value)
    try:
        timestamp = int(fields["t"][0])
    except (KeyError, ValueError):
        return False
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = signature(secret, timestamp, body)
    return any(hmac.compare_digest(expected, v) for v in fields.get("v1", []))
