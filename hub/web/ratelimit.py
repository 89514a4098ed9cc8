"""Failed logins counted per username and client address in the shared cache (Redis), so a
password cannot be guessed quickly through any number of web processes; sign-ups counted per
address. One limiter for every login form (the dashboard's and the admin's)."""

from __future__ import annotations

import hashlib
import unicodedata

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest


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


def _count(key: str, window_s: int) -> int:
    """Add one to a counter that lives ``window_s`` from its first count; the new count."""
    # add() starts the window only once; incr() keeps its expiry.
    if cache.add(key, 1, timeout=window_s):
        return 1
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between the two calls
        cache.add(key, 1, timeout=window_s)
        return 1


def record_failure(username: str, address: str) -> None:
    _count(_key(username, address), settings.LOGIN_RATE_WINDOW_S)


def clear(username: str, address: str) -> None:
    cache.delete(_key(username, address))


def _signup_key(address: str) -> str:
    return f"signups:{hashlib.sha256(address.encode()).hexdigest()[:40]}"


def signup_allowed(address: str) -> bool:
    """Counts this sign-up attempt; False once the address made SIGNUP_RATE_LIMIT in the window."""
    count = _count(_signup_key(address), settings.SIGNUP_RATE_WINDOW_S)
    return count <= settings.SIGNUP_RATE_LIMIT
