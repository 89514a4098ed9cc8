"""WebSocket routes. Agents authenticate with their own token, not with the session cookie,
so no origin validator wraps the agent endpoint; browser endpoints add their own."""

from __future__ import annotations

from django.urls import URLPattern

websocket_urlpatterns: list[URLPattern] = []
