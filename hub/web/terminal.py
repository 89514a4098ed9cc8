"""The lease page's terminal: the renter's own socket (session cookie, the hub's own Origin;
hub/routing.py) onto hub/leases/terminal_socket.py, and the page that opens it."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.db import database_sync_to_async
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from hub.leases.models import Lease
from hub.leases.terminal_socket import TerminalSocket
from hub.web.consumers import CLOSE_UNAUTHENTICATED as CLOSE_SIGNED_OUT
from hub.web.consumers import session_is_live

# How often an open terminal checks that its session still exists: signing out (in any tab)
# or the session's expiry ends the shell within this.
SESSION_CHECK_S = 2.0


class BrowserTerminal(TerminalSocket):
    via = "web"
    _watch: asyncio.Task[None] | None = None

    async def person(self) -> int | None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return None
        return int(user.pk)

    async def connect(self) -> None:
        await super().connect()
        if self.opened is not None and not self.exited:
            self._watch = asyncio.create_task(self._watch_session())

    async def _watch_session(self) -> None:
        session_key = getattr(self.scope.get("session"), "session_key", None)
        user_id = int(self.scope["user"].pk)
        while not self.exited:
            await asyncio.sleep(SESSION_CHECK_S)
            if not await database_sync_to_async(session_is_live)(session_key, user_id):
                await self._finish(
                    None, "signed out: the session ended", code=CLOSE_SIGNED_OUT, ours=True
                )

    async def disconnect(self, code: int) -> None:
        if self._watch is not None:
            self._watch.cancel()
        await super().disconnect(code)


@login_required
@require_GET
def terminal_page(request: HttpRequest, lease_id: Any) -> HttpResponse:
    # Someone else's lease is a 404, like the lease page; the socket refuses it again anyway.
    lease = get_object_or_404(Lease, pk=lease_id, renter=request.user)
    return render(request, "web/terminal.html", {"lease": lease})
