"""A tiny ASGI app for the cross-process Channels test (not part of the hub).

Each WebSocket learns its channel name on connect; a message sent to it from a connection held
by another Daphne process travels through the channels_redis layer.
"""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")
django.setup()

from channels.generic.websocket import AsyncJsonWebsocketConsumer  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.urls import path  # noqa: E402


class RelayConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        await self.accept()
        await self.send_json({"channel": self.channel_name, "pid": os.getpid()})

    async def receive_json(self, content: dict[str, str], **kwargs: object) -> None:
        await self.channel_layer.send(
            content["to"],
            {"type": "relay.message", "text": content["text"], "from_pid": os.getpid()},
        )

    async def relay_message(self, event: dict[str, object]) -> None:
        await self.send_json(
            {"text": event["text"], "from_pid": event["from_pid"], "pid": os.getpid()}
        )


application = ProtocolTypeRouter(
    {"websocket": URLRouter([path("relay/", RelayConsumer.as_asgi())])}
)
