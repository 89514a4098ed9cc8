"""Renters' access tokens for protected tunnel URLs: signed by the hub, bound to one lease.

A protected URL needs the token as a cookie (set by the form at ``/__cloudgpu/access`` on the
tunnel's own host), as ``Authorization: Bearer`` or as ``X-CloudGPU-Access``; a leaked URL alone
opens nothing. The token dies with the lease: the edge routes only leases that are running.
"""

from __future__ import annotations

from django.conf import settings
from django.core import signing

PREFIX = "cgpa_"  # recognisable, so that logs can redact it (hub/lib/redact.py)
COOKIE = "cloudgpu_access"
HEADER = "X-CloudGPU-Access"
_SALT = "cloudgpu.tunnels.access"


def issue(lease_id: object) -> str:
    return PREFIX + signing.dumps(str(lease_id), salt=_SALT, compress=False)


def grants(lease_id: object, token: str | None) -> bool:
    if not token or not token.startswith(PREFIX):
        return False
    try:
        value = signing.loads(
            token[len(PREFIX) :], salt=_SALT, max_age=settings.TUNNEL_ACCESS_TOKEN_MAX_AGE_S
        )
    except signing.BadSignature:  # also SignatureExpired
        return False
    return value == str(lease_id)


def candidates(headers: dict[str, str], cookies: dict[str, str]) -> list[str]:
    """Every place a client may put the token; any one of them that grants access will do."""
    found = []
    authorization = headers.get("Authorization", "")
    if authorization[:7].lower() == "bearer ":
        found.append(authorization[7:].strip())
    if headers.get(HEADER):
        found.append(headers[HEADER].strip())
    if cookies.get(COOKIE):
        found.append(cookies[COOKIE])
    return found
