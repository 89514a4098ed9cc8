"""Renters' REST API tokens: ``cgpr_<30 random base62><6 base62 CRC32 checksum>``.

The same format as agent tokens (hub/lib/tokens.py) with its own prefix, so secret scanners and
the log redaction (hub/lib/redact.py) spot a leaked one and a mistyped one costs no query. The
plaintext is returned once, at creation; only its SHA-256 digest is stored.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from hub.accounts.models import ApiToken, User
from hub.lib import tokens

PREFIX = "cgpr_"
# last_used_at is for people ("used today?"): one UPDATE a minute per token is plenty, and a
# busy script does not turn every API call into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def create_api_token(user: User, name: str = "") -> tuple[ApiToken, str]:
    """Create a token; the plaintext is returned this once and never stored."""
    plaintext = tokens.generate_token(PREFIX)
    token = ApiToken.objects.create(
        user=user,
        name=name.strip()[:100],
        prefix=tokens.visible_prefix(plaintext),
        digest=tokens.digest(plaintext),
    )
    return token, plaintext


def authenticate_api_token(plaintext: str | None) -> ApiToken | None:
    """The live token (with its user) behind a plaintext, or None."""
    if not plaintext or not tokens.well_formed(plaintext, PREFIX):
        return None
    token = (
        ApiToken.objects.select_related("user")
        .filter(digest=tokens.digest(plaintext), revoked_at__isnull=True)
        .first()
    )
    if token is None or not token.user.is_active:
        return None
    now = timezone.now()
    ApiToken.objects.filter(pk=token.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
    ).update(last_used_at=now)
    return token


def revoke_api_token(user: User, token_id: int) -> bool:
    """Revoke one of ``user``'s tokens; False if it is not theirs or was already revoked."""
    return bool(
        ApiToken.objects.filter(pk=token_id, user=user, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    )
