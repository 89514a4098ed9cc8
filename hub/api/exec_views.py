"""Commands and terminals in a renter's running lease through the API (issue 17 item 1).

``POST /api/v1/leases/{id}/exec/`` runs one command and answers its exit code and output;
``/api/v1/leases/{id}/terminal/`` (WebSocket) is an interactive terminal, the same protocol as
the lease page's (hub/leases/terminal_socket.py). Both take an API token with the ``leases``
scope (``Authorization: Bearer cgpr_...``), and only for the token owner's own leases.

The command endpoint is a plain async Django view, not a DRF one: it waits for the command
(up to ``timeout_s``) without holding a thread, where a DRF view would hold the one thread
Django's ASGI handler runs every sync view of the process on. It answers in the API's error
shape (``{"detail": ...}``) all the same.
"""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from hub.accounts.api_tokens import PREFIX, authenticate_api_token
from hub.accounts.models import ApiScope, ApiToken
from hub.leases import terminals
from hub.leases.models import ExecSession
from hub.leases.terminal_socket import TerminalSocket
from supplier_agent.protocol import MAX_STR

DEFAULT_TIMEOUT_S = 60


def _bearer(headers: Any) -> str | None:
    scheme, _, credential = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        return None
    return credential.strip()


def _token_owner(plaintext: str | None) -> tuple[int | None, str | None]:
    """(user id, None) for a live token with the ``leases`` scope, else (None, why)."""
    token: ApiToken | None = authenticate_api_token(plaintext) if plaintext else None
    if token is None:
        return None, f"send an API token: 'Authorization: Bearer {PREFIX}...'"
    if not token.has_scope(ApiScope.LEASES):
        return None, "this API token lacks the 'leases' scope that exec needs"
    return token.user_id, None


def _error(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


def _command(body: Any) -> tuple[tuple[str, ...], int] | str:
    if not isinstance(body, dict):
        return 'send a JSON object: {"command": ["nvidia-smi"], "timeout_s": 60}'
    command = body.get("command")
    if (
        not isinstance(command, list)
        or not command
        or len(command) > 256
        or not all(isinstance(a, str) and len(a) <= MAX_STR and "\x00" not in a for a in command)
    ):
        return "command: a list of 1 to 256 strings, the program first (no shell is implied)"
    timeout = body.get("timeout_s", DEFAULT_TIMEOUT_S)
    if type(timeout) is not int or not 1 <= timeout <= terminals.MAX_COMMAND_TIMEOUT_S:
        return f"timeout_s: a whole number of seconds from 1 to {terminals.MAX_COMMAND_TIMEOUT_S}"
    cleaned = tuple(a.encode("utf-8", "replace").decode("utf-8") for a in command)
    return cleaned, timeout


@csrf_exempt  # token-authenticated only: no cookie, so nothing to forge
async def lease_exec(request: HttpRequest, pk: Any) -> JsonResponse:
    if request.method != "POST":
        return _error(405, f'method "{request.method}" not allowed; POST a command')
    user_id, why = await sync_to_async(_token_owner)(_bearer(request.headers))
    if user_id is None:
        return _error(401, why or "unauthenticated")
    try:
        parsed = _command(json.loads(request.body or b"null"))
    except ValueError:
        parsed = "the body is not JSON"
    if isinstance(parsed, str):
        return _error(400, parsed)
    command, timeout_s = parsed
    try:
        opened = await sync_to_async(terminals.open_session)(
            user_id, str(pk), ExecSession.Via.API, command
        )
    except terminals.TerminalRefused as exc:
        status = 404 if "no such rental" in str(exc) else 409
        return _error(status, str(exc))
    result = await terminals.run_command(opened, command, timeout_s=timeout_s)
    return JsonResponse(
        {
            "session_id": opened.session_id,
            "exit_code": result.exit_code,
            "output": result.output,
            "truncated": result.truncated,
            "error": result.error,
        },
        # A command that ran answers 200 whatever its exit code; 504: it outlived timeout_s;
        # 502: the host could not run it (the answer's error says why).
        status=504 if result.timed_out else 502 if result.exit_code is None else 200,
    )


class ApiTerminal(TerminalSocket):
    """The interactive terminal for API clients: a bearer token with the ``leases`` scope."""

    via = ExecSession.Via.API

    async def person(self) -> int | None:
        headers = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in self.scope.get("headers", [])
        }
        user_id, _ = await sync_to_async(_token_owner)(_bearer(headers))
        return user_id
