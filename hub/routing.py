"""WebSocket routes. Agents authenticate with their own token, not with the session cookie,
so no origin validator wraps the agent endpoint; browser endpoints add their own."""

from __future__ import annotations

from channels.auth import AuthMiddlewareStack
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.security.websocket import OriginValidator
from django.conf import settings
from django.urls import URLPattern, path, re_path

from hub.agents.consumer import AgentConsumer
from hub.api.exec_views import ApiTerminal
from hub.web.consumers import LiveConsumer
from hub.web.terminal import BrowserTerminal


class UnknownPath(AsyncWebsocketConsumer):
    """Any other WebSocket path (`/api/p2p/ws/../../admin/`, a 10 KB token, `%00`): refused at
    the handshake (HTTP 403) at once. Without it Channels raised "No route found", which Daphne
    answered with a 500 and a traceback in the log."""

    async def connect(self) -> None:
        await self.close()


websocket_urlpatterns: list[URLPattern] = [
    path("api/p2p/ws/", AgentConsumer.as_asgi()),
    # The original agents' form, kept for compatibility; the token never reaches a log line.
    re_path(r"^api/p2p/ws/(?P<token>[A-Za-z0-9_]{1,128})/?$", AgentConsumer.as_asgi()),
    # The dashboard's live updates: same-origin browsers with a session only.
    # Origin must be the hub's own, scheme, host and port exactly (settings.LIVE_SOCKET_ORIGINS):
    # a host-only check let another port of the same host in.
    path(
        "ws/live/",
        OriginValidator(
            AuthMiddlewareStack(LiveConsumer.as_asgi()),
            settings.LIVE_SOCKET_ORIGINS,
        ),
    ),
    # A renter's terminal in their running lease (hub/leases/terminal_socket.py): the same
    # Origin and session rules as the live socket.
    path(
        "ws/leases/<uuid:lease_id>/terminal/",
        OriginValidator(
            AuthMiddlewareStack(BrowserTerminal.as_asgi()),
            settings.LIVE_SOCKET_ORIGINS,
        ),
    ),
    # The same for API clients, with a bearer token (no cookie, so no Origin rule to need).
    path("api/v1/leases/<uuid:lease_id>/terminal/", ApiTerminal.as_asgi()),
    re_path(r"", UnknownPath.as_asgi()),
]
