"""Enrollment codes: the install one-liner's single-use, short-lived stand-in for a token.

``curl .../install.sh | sudo bash -s cgpe_...`` puts its argument where every local user can
read it (``ps``), and into shell history and sudo's log. So the one-liner carries a code, not a
token: the installer exchanges it once, over HTTPS, for a new agent token that goes straight
into the agent's 0600 config file. After that (or after ``ENROLLMENT_CODE_TTL_S``) the copies
left on the host are worthless.

Codes share the token format (hub/lib/tokens.py) with their own prefix, so a mistyped or
made-up code costs no query and the log redaction (hub/lib/redact.py) hides a leaked one.
Agent tokens are stored only as digests, so an exchange cannot hand out an existing token: it
mints a new one for the code's owner.
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from hub.accounts.models import User
from hub.installer.models import EnrollmentCode
from hub.lib import tokens, window_count
from hub.suppliers import services as suppliers
from hub.suppliers.models import AgentToken

PREFIX = "cgpe_"
_NEW_COMMAND = "create a new install command on the hub's agent tokens page"


@dataclass(frozen=True)
class Refusal:
    reason: str
    status: int
    message: str


MALFORMED = Refusal("malformed", 400, f"that is not an enrollment code: {_NEW_COMMAND}")
UNKNOWN = Refusal("unknown", 404, f"the hub knows no such enrollment code: {_NEW_COMMAND}")
USED = Refusal(
    "used", 410, f"this enrollment code was already used (each works once): {_NEW_COMMAND}"
)
EXPIRED = Refusal("expired", 410, f"this enrollment code has expired: {_NEW_COMMAND}")
REVOKED = Refusal("revoked", 410, f"this enrollment code was cancelled: {_NEW_COMMAND}")
ACCOUNT_DISABLED = Refusal(
    "account_disabled", 403, "the account this enrollment code belongs to is disabled"
)
RATE_LIMITED = Refusal(
    "rate_limited",
    429,
    "too many failed enrollment attempts from this address; wait a while and try again",
)


class EnrollmentRefused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def create_enrollment_code(owner: User, name: str = "") -> tuple[EnrollmentCode, str]:
    """A new code; the plaintext is returned this once and never stored."""
    plaintext = tokens.generate_token(PREFIX)
    code = EnrollmentCode.objects.create(
        owner=owner,
        name=name.strip()[:100],
        prefix=tokens.visible_prefix(plaintext),
        digest=tokens.digest(plaintext),
        expires_at=timezone.now() + timedelta(seconds=settings.ENROLLMENT_CODE_TTL_S),
    )
    return code, plaintext


def revoke_enrollment_code(owner: User, code_id: int) -> bool:
    """Cancel one of ``owner``'s unused codes; False if not theirs, used or already cancelled."""
    return bool(
        EnrollmentCode.objects.filter(
            pk=code_id, owner=owner, used_at__isnull=True, revoked_at__isnull=True
        ).update(revoked_at=timezone.now())
    )


def exchange_enrollment_code(
    plaintext: str, *, address: str | None = None, host: str = ""
) -> tuple[AgentToken, str]:
    """Use up a code: a new agent token for its owner, its plaintext returned this once.

    Raises EnrollmentRefused, and counts the failure against ``address``; an address with
    ENROLLMENT_RATE_LIMIT failures in the window is refused even a good code.
    """
    if _blocked(address):
        raise EnrollmentRefused(RATE_LIMITED)
    try:
        return _exchange(plaintext, address=address, host=_printable(host, 255))
    except EnrollmentRefused:
        _record_failure(address)
        raise


def _exchange(plaintext: str, *, address: str | None, host: str) -> tuple[AgentToken, str]:
    if not tokens.well_formed(plaintext, PREFIX):
        raise EnrollmentRefused(MALFORMED)  # a mistyped or made-up code costs no query
    with transaction.atomic():
        # The row lock makes "once" hold between concurrent exchanges: the second waits here for
        # the first to commit, then reads used_at set.
        code = (
            EnrollmentCode.objects.select_for_update(of=("self",))
            .select_related("owner")
            .filter(digest=tokens.digest(plaintext))
            .first()
        )
        now = timezone.now()
        if code is None:
            raise EnrollmentRefused(UNKNOWN)
        if code.used_at is not None:
            raise EnrollmentRefused(USED)
        if code.revoked_at is not None:
            raise EnrollmentRefused(REVOKED)
        if code.expires_at <= now:
            raise EnrollmentRefused(EXPIRED)
        if not code.owner.is_active:
            raise EnrollmentRefused(ACCOUNT_DISABLED)
        token, token_plaintext = suppliers.create_agent_token(
            code.owner, code.name or host or f"enrolled with {code.prefix}"
        )
        code.used_at = now
        code.used_from = _ip_or_none(address)
        code.used_by_host = host
        code.token = token
        code.save(update_fields=["used_at", "used_from", "used_by_host", "token"])
    return token, token_plaintext


# --- the per-address limit on failures ---------------------------------------------------------


def _rate_key(address: str | None) -> str:
    ip = _ip_or_none(address)
    # One IPv6 host usually holds a whole /64: counting single addresses would let it rotate.
    if ip is not None and ipaddress.ip_address(ip).version == 6:
        ip = str(ipaddress.ip_network(f"{ip}/64", strict=False))
    name = ip or "unknown"
    return f"enroll-failures:{hashlib.sha256(name.encode()).hexdigest()[:40]}"


def _blocked(address: str | None) -> bool:
    return int(cache.get(_rate_key(address), 0)) >= settings.ENROLLMENT_RATE_LIMIT


def _record_failure(address: str | None) -> None:
    window_count.count(cache, _rate_key(address), settings.ENROLLMENT_RATE_WINDOW_S)


# --- bounds on what the installer sends -----------------------------------------------------


def _ip_or_none(address: str | None) -> str | None:
    try:
        return str(ipaddress.ip_address(address or ""))
    except ValueError:
        return None


def _printable(value: str, limit: int) -> str:
    # The hostname comes from the host being enrolled: it becomes a token name and an admin
    # field, so no NUL, control characters or lone surrogates (Postgres refuses some of them).
    return "".join(c for c in value if c.isprintable()).strip()[:limit]
