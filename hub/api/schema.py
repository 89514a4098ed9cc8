"""The OpenAPI schema says which token scope each operation needs.

OpenAPI 3.0 lets a bearer scheme's security requirement list no scopes (only OAuth2 and OpenID
Connect may), so the scope goes where clients and people both find it: an ``x-required-scope``
extension, a sentence in the description, and a documented 403 for a token without it.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse

from hub.api.permissions import required_scope
from hub.api.serializers import ErrorSerializer


class ScopedAutoSchema(AutoSchema):
    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation = super().get_operation(*args, **kwargs)
        scope = required_scope(self.view, self.method)
        if operation is None or scope is None:
            return operation
        operation["x-required-scope"] = str(scope)
        needs = f"Needs the `{scope}` scope with an API token (a session has every scope)."
        description = operation.get("description", "")
        operation["description"] = f"{description}\n\n{needs}" if description else needs
        forbidden = OpenApiResponse(
            ErrorSerializer, description=f"The API token lacks the `{scope}` scope."
        )
        operation["responses"].setdefault("403", self._get_response_for_code(forbidden, "403"))
        return operation
