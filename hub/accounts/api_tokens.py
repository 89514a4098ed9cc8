"""Renters' REST API tokens: ``cgpr_<30 random base62><6 base62 CRC32 checksum>``.

The same format as agent tokens (hub/lib/tokens.py) with its own prefix, so secret scanners and
the log redaction (hub/lib/redact.py) spot a leaked one and a mistyped one costs no query. The
plaintext is returned once, at creation; only its SHA-256 digest is stored.

Each token carries scopes (hub.accounts.models.ApiScope); hub/api/permissions.py enforces them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from hub.accounts.models import DEFAULT_API_SCOPES, ApiScope, ApiToken, User
from hub.lib import tokens
from hub.notifications.events import emit

PREFIX = "cgpr_"
# last_used_at is for people ("used today?"): one UPDATE a minute per token is plenty, and a
# busy script does not turn every API call into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class UnknownScope(ValueError):
    """A scope that is not one of ApiScope's."""


class ScopeEscalation(Exception):
    """A token asked to create a token with scopes it does not hold itself."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        names = ", ".join(f"'{scope}'" for scope in missing)
        super().__init__(
            f"this API token cannot grant {names}: a token creates only tokens with scopes it"
            " has itself (create it from the dashboard instead)"
        )


def clean_scopes(scopes: Iterable[str]) -> list[str]:
    """The scopes in ApiScope's order, each once; UnknownScope names any that do not exist."""
    wanted = set(scopes)
    unknown = sorted(wanted - set(ApiScope.values))
    if unknown:
        raise UnknownScope(
            f"unknown scope {unknown[0]!r}: choose from {', '.join(ApiScope.values)}"
        )
    return [scope for scope in ApiScope.values if scope in wanted]


def create_api_token(
    user: User,
    name: str = "",
    scopes: Iterable[str] = DEFAULT_API_SCOPES,
    *,
    created_by: ApiToken | None = None,
) -> tuple[ApiToken, str]:
    """Create a token; the plaintext is returned this once and never stored.

    ``created_by`` is the token behind an API request (None for the dashboard, the admin and the
    CLI, which act as the person): the new token may hold no scope that one lacks, or a leaked
    token could mint a stronger one.
    """
    wanted = clean_scopes(scopes)
    if created_by is not None:
        missing = [scope for scope in wanted if scope not in created_by.scopes]
        if missing:
            raise ScopeEscalation(missing)
    plaintext = tokens.generate_token(PREFIX)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user,
            name=name.strip()[:100],
            prefix=tokens.visible_prefix(plaintext),
            digest=tokens.digest(plaintext),
            scopes=wanted,
        )
        # Its owner hears of every new token (a stolen session minting one shows up). What
        # tells it apart only: never the plaintext.
        emit(
            user.pk,
            "security.api_token_created",
            {"name": token.name, "prefix": token.prefix, "scopes": list(token.scopes)},
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
