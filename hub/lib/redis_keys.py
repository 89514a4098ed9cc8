"""Every Redis key the hub writes itself starts with REDIS_KEY_PREFIX.

Two hubs (staging and production, or a test run beside a live hub) can then share one Redis:
the channel layer, the cache and Celery's broker take the same prefix by default
(hub/settings.py), and the hub's own keys come from here. Keys are built per call from
settings, so a test isolates itself with ``override_settings(REDIS_KEY_PREFIX=...)`` instead
of patching module constants.
"""

from __future__ import annotations

from django.conf import settings


def key(*parts: str) -> str:
    """``key("host-liveness")`` -> ``"cloudgpu:host-liveness"``."""
    return ":".join((settings.REDIS_KEY_PREFIX, *parts))
