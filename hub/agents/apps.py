from __future__ import annotations

from django.apps import AppConfig


class AgentsConfig(AppConfig):
    """The agents' side of the hub: their WebSocket, registration, heartbeats and the liveness
    sweep. It sits on top, beside the pages and the API (docs/architecture.md, "Layers"): it
    calls into leases, tunnels, volumes and suppliers; nothing below calls into it. No models."""

    name = "hub.agents"
