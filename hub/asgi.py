"""ASGI entry point: Django for HTTP, Channels for WebSockets (agents, live dashboard)."""

from __future__ import annotations

import os
from typing import Any

import django
from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hub.settings")


class ReleasingASGIHandler(ASGIHandler):
    """Django's handler, minus a reference cycle per request (issue 23).

    Django 5.2's ``handle`` races the view against ``listen_for_disconnect``; Daphne sends
    ``http.disconnect`` once a response is out, so the listener raised ``RequestAborted``,
    whose traceback holds ``handle``'s frame, whose ``tasks`` hold the exception: every
    response (body included) waited for a full collection. The web process grew ~100 MiB/h
    under the REST logs endpoint. On 5.2 ``handle`` cancels the view on FIRST_COMPLETED and
    ignores the listener's outcome, so returning instead of raising changes nothing else.
    Django 6.1 reworks ``handle`` (a returning listener would no longer cancel the view):
    there the stock handler is used.
    """

    async def listen_for_disconnect(self, receive: Any) -> None:
        message = await receive()
        if message["type"] != "http.disconnect":
            raise AssertionError(f"Invalid ASGI message after request body: {message['type']}")


def django_application() -> ASGIHandler:
    if django.VERSION >= (6, 1):
        return get_asgi_application()
    django.setup(set_prefix=False)
    return ReleasingASGIHandler()


# Django must be set up before anything imports models (consumers do).
django_asgi_app = django_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from hub.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
