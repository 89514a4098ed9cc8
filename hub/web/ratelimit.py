"""Failed logins counted per username and client address in the shared cache (Redis), so a
password cannot be guessed quickly through any number of web processes."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest


def _key(username: str, address: str) -> str:
    # Hashed: usernames are free text and cache keys must be short and safe.
    digest = hashlib.sha256(f"{username.strip().lower()}\0{address}".encode()).hexdigest()
    return f"login-failures:{digest[:40]}"


def client_address(request: HttpRequest) -> str:
    # REMOTE_ADDR only: a forwarded-for header is the client's to forge.
    return request.META.get("REMOTE_ADDR") or "unknown"


def blocked(username: str, address: str) -> bool:
    return int(cache.get(_key(username, address), 0)) >= settings.LOGIN_RATE_LIMIT


def record_failure(username: str, address: str) -> None:
    key = _key(username, address)
    # add() starts the window only once; incr() keeps its expiry.
    if not cache.add(key, 1, timeout=settings.LOGIN_RATE_WINDOW_S):
        try:
            cache.incr(key)
        except ValueError:  # expired between the two calls
            cache.add(key, 1, timeout=settings.LOGIN_RATE_WINDOW_S)


def clear(username: str, address: str) -> None:
    cache.delete(_key(username, address))
