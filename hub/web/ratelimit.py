"""Failed logins counted per username and client address in the shared cache (Redis), so a
password cannot be guessed quickly through any number of web processes; sign-ups counted per
address. One limiter for every login form (the dashboard's and the admin's)."""

from __future__ import annotations

import hashlib
import unicodedata

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

from hub.lib import window_count


def normalized_username(username: str) -> str:
    """What Django logs in as (NFKC, as its login form normalises), case folded: fullwidth or
    mathematical-bold look-alikes of a name share its counter instead of getting their own."""
    return unicodedata.normalize("NFKC", username).casefold().strip()


def _key(username: str, address: str) -> str:
    # Hashed: usernames are free text and cache keys must be short and safe.
    name = normalized_username(username)
    digest = hashlib.sha256(f"{name}\0{address}".encode(errors="surrogatepass")).hexdigest()
    return f"login-failures:{digest[:40]}"


def client_address(request: HttpRequest) -> str:
    # REMOTE_ADDR only: a forwarded-for header is the client's to forge.
    return request.META.get("REMOTE_ADDR") or "unknown"


def blocked(username: str, address: str) -> bool:
    return int(cache.get(_key(username, address), 0)) >= settings.LOGIN_RATE_LIMIT


def record_failure(username: str, address: str) -> None:
    window_count.count(cache, _key(username, address), settings.LOGIN_RATE_WINDOW_S)


def clear(username: str, address: str) -> None:
    cache.delete(_key(username, address))


def _signup_key(address: str) -> str:
    return f"signups:{hashlib.sha256(address.encode()).hexdigest()[:40]}"


def signup_allowed(address: str) -> bool:
    """Counts this sign-up attempt; False once the address made SIGNUP_RATE_LIMIT in the window."""
    count = window_count.count(cache, _signup_key(address), settings.SIGNUP_RATE_WINDOW_S)
    return count <= settings.SIGNUP_RATE_LIMIT
