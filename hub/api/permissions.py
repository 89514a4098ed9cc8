"""API token scopes, enforced per view and method.

Every API view says which scope each of its methods needs in ``required_scopes``
(``{"GET": ApiScope.READ, ...}``). A dashboard session acts as the person and has every scope; a
token needs the one named. A method a view implements without naming its scope is refused to
everyone: forgetting the declaration must close an endpoint, not open it (and
tests/hub/api/test_scopes.py walks the URL conf so it is caught before it ships).
"""

from __future__ import annotations

from typing import Any

from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from hub.accounts.models import ApiScope, ApiToken

# OPTIONS describes an endpoint (its name, parsers and renderers) and holds no data: any token
# that can read may ask, wherever the view's own methods need more.
OPTIONS_SCOPE = ApiScope.READ


def required_scope(view: Any, method: str) -> ApiScope | None:
    """The scope ``method`` needs on ``view``, or None when the view declares none for it."""
    declared: dict[str, ApiScope] = getattr(view, "required_scopes", {})
    method = method.upper()
    if method in declared:
        return declared[method]
    if method == "HEAD":
        return declared.get("GET")  # Django answers HEAD with the GET handler
    if method == "OPTIONS":
        return OPTIONS_SCOPE
    return None


def implements(view: Any, method: str) -> bool:
    """Whether ``view`` answers ``method`` itself (others get DRF's 405, which needs no scope)."""
    return method.lower() in getattr(view, "http_method_names", ()) and hasattr(
        view, method.lower()
    )


class HasScope(BasePermission):
    """The request's credentials hold the scope the view declares for its method."""

    def has_permission(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False  # IsAuthenticated answers 401 first; this never opens a door
        if not implements(view, request.method or ""):
            return True  # the handler is DRF's "method not allowed": 405, not 403
        scope = required_scope(view, request.method or "")
        if scope is None:
            raise PermissionDenied(
                f"{request.method} {request.path} declares no API scope, so nobody may call it"
            )
        if isinstance(request.auth, ApiToken):
            if request.auth.has_scope(scope):
                return True
            raise PermissionDenied(
                f"this API token lacks the '{scope}' scope that {request.method} needs here;"
                f" create a token with '{scope}' on the API tokens page"
            )
        # The dashboard's session is the person, not a token: every scope.
        return isinstance(request.successful_authenticator, SessionAuthentication)
