"""``Authorization: Bearer cgpr_...``: renters' API tokens (hub/accounts/api_tokens.py)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from hub.accounts.api_tokens import PREFIX, authenticate_api_token
from hub.accounts.models import ApiScope, ApiToken, User


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[User, ApiToken] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != b"bearer":
            return None  # not ours: the session may still authenticate the request
        if len(parts) != 2:
            raise AuthenticationFailed(f"use the header 'Authorization: Bearer {PREFIX}...'")
        try:
            plaintext = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("invalid API token") from None
        token = authenticate_api_token(plaintext)
        if token is None:
            # One message for wrong, revoked and made-up tokens: it tells a guesser nothing.
            raise AuthenticationFailed("invalid or revoked API token")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) to a request without credentials.
        return 'Bearer realm="api"'


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = ApiTokenAuthentication
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        scheme = build_bearer_security_scheme_object(
            header_name="Authorization",
            token_prefix="Bearer",  # noqa: S106
        )
        scopes = "; ".join(scope.label for scope in ApiScope)
        scheme["description"] = (
            f"A renter's API token, `{PREFIX}` + 36 characters. Its scopes limit what it may do"
            f" ({scopes}); each operation's `x-required-scope` names the one it needs, and a"
            " token without it gets 403. New tokens get `read` and `leases`; a token creates"
            " only tokens with scopes it has itself."
        )
        return scheme
