"""How long ago something happened, in the words every page uses ("3 min ago").

hub/web/static/web/live.js writes the same words as the seconds go by: keep the two alike.
"""

from __future__ import annotations

from datetime import datetime, timezone


def ago_words(seconds: float) -> str:
    """``3`` -> "just now", ``42`` -> "42 s ago", ``200`` -> "3 min ago",
    ``7500`` -> "2 h 5 min ago", ``259200`` -> "3 days ago"."""
    whole = max(0, int(seconds))
    if whole < 5:
        return "just now"
    if whole < 60:
        return f"{whole} s ago"
    if whole < 3600:
        return f"{whole // 60} min ago"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60} min ago"
    days = whole // 86400
    return f"{days} day{'s' if days != 1 else ''} ago"


def ago(moment: datetime, now: datetime | None = None) -> str:
    return ago_words(((now or datetime.now(timezone.utc)) - moment).total_seconds())
