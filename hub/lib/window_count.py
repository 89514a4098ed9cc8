"""Counters that live a fixed window from their first count, kept in a cache every hub process
shares (the hub's Redis): the login, sign-up and enrollment-code limits."""

from __future__ import annotations

from typing import Any, Protocol


class Cache(Protocol):
    """The part of Django's cache API a counter needs."""

    def add(self, key: str, value: Any, timeout: int) -> bool: ...
    def incr(self, key: str) -> int: ...


def count(cache: Cache, key: str, window_s: int) -> int:
    """Add one to a counter that lives ``window_s`` from its first count; the new count."""
    # add() starts the window only once; incr() keeps its expiry.
    if cache.add(key, 1, timeout=window_s):
        return 1
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between the two calls
        cache.add(key, 1, timeout=window_s)
        return 1
