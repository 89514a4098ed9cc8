"""The lease page's terminal: the renter's own socket (session cookie, the hub's own Origin;
hub/routing.py) onto hub/leases/terminal_socket.py, and the page that opens it."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from hub.leases.models import Lease
from hub.leases.terminal_socket import TerminalSocket


class BrowserTerminal(TerminalSocket):
    via = "web"

    async def person(self) -> int | None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return None
        return int(user.pk)


@login_required
@require_GET
def terminal_page(request: HttpRequest, lease_id: Any) -> HttpResponse:
    # Someone else's lease is a 404, like the lease page; the socket refuses it again anyway.
    lease = get_object_or_404(Lease, pk=lease_id, renter=request.user)
    return render(request, "web/terminal.html", {"lease": lease})
