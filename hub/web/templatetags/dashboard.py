"""``{% load dashboard %}``: human units, state badges and inline SVG sparklines."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from hub.lib.timewords import ago

register = template.Library()

GIB = 1 << 30
_BADGE_TONES = {
    "running": "ok",
    "online": "ok",
    "up": "ok",
    "pending": "wait",
    "reserving": "wait",
    "starting": "wait",
    "stopping": "wait",
    "ended": "muted",
    "closed": "muted",
    "offline": "bad",
    "failed": "bad",
    "down": "bad",
    "revoked": "muted",
    "maintenance": "warn",
    # A GPU's states (hub/leases/gpu_status.py).
    "rented": "wait",
    "listed": "ok",
    "unlisted": "muted",
    "delisted": "bad",
}


@register.filter
def gib(num_bytes: int | None) -> str:
    """``25769803776`` -> ``24 GiB``; one decimal below 10 GiB."""
    if not num_bytes:
        return "0 GiB"
    value = num_bytes / GIB
    return f"{value:.1f} GiB" if value < 10 and value != int(value) else f"{value:.0f} GiB"


@register.filter
def ratio_pct(value: float | None) -> str:
    """A 0..1 share as a percentage: ``0.9931`` -> ``99.3 %``."""
    if value is None:
        return "-"
    return f"{value * 100:.1f} %"


@register.filter
def pct(value: int | None) -> str:
    return "-" if value is None else f"{value} %"


@register.filter
def hours(delta: timedelta | None) -> str:
    if delta is None:
        return "-"
    seconds = int(delta.total_seconds())
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h} h {m:02d} min" if h else (f"{m} min {s:02d} s" if m else f"{s} s")


@register.simple_tag
def since(moment: datetime | None, never: str = "never") -> SafeString:
    """A "3 min ago" that keeps counting in the browser (live.js updates every ``time[data-since]``
    every few seconds, in hub/lib/timewords.py's words), with the UTC time as its tooltip."""
    if moment is None:
        return format_html("{}", never)
    return format_html(
        '<time datetime="{}" data-since="{}" title="{} UTC">{}</time>',
        moment.isoformat(),
        moment.isoformat(),
        moment.strftime("%Y-%m-%d %H:%M:%S"),
        ago(moment),
    )


@register.simple_tag
def badge(state: str, label: str = "") -> SafeString:
    tone = _BADGE_TONES.get(state, "muted")
    return format_html(
        '<span class="badge badge-{}" data-state="{}">{}</span>', tone, state, label or state
    )


@register.simple_tag
def sparkline(
    values: Sequence[float], maximum: float = 100, label: str = "", width: int = 120
) -> SafeString:
    """An inline SVG polyline of ``values`` scaled to 0..maximum; no JavaScript, no build."""
    height = 24
    if not values:
        return format_html('<span class="spark-empty">{}</span>', "no samples yet")
    top = maximum or max(values) or 1
    step = width / max(len(values) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{height - 1 - (min(v, top) / top) * (height - 2):.1f}"
        for i, v in enumerate(values)
    )
    if len(values) == 1:
        points += f" {width:.1f},{points.split(',')[1]}"
    return format_html(
        '<svg class="spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="{}"><polyline fill="none" stroke="currentColor" stroke-width="1.5" '
        'points="{}"/></svg>',
        width,
        height,
        width,
        height,
        label,
        points,
    )


_END_REASONS = {
    "renter_stop": "You stopped it.",
    "expired": "It reached the keep-alive limit you set.",
    "no_funds": "Your balance ran out (out of funds). Top up to rent again.",
    "host_lost": (
        "The host went away and did not come back in time. Time it was away is not charged."
    ),
    "admin": "An administrator stopped it.",
    "error": "It could not be started on the host.",
    "out_of_memory": (
        "It ran out of memory: the container used all the memory that comes with its GPUs "
        "and was stopped by the host."
    ),
    "disk": (
        "The host stopped it for its disk use: it wrote more than its disk allowance, or the "
        "most while the host's disk ran low."
    ),
}


@register.filter
def end_reason_words(lease: Any) -> str:
    """Why a lease ended, as a sentence a renter understands."""
    if lease.end_reason == "exited":
        code = "" if lease.exit_code is None else f" with exit code {lease.exit_code}"
        return f"The container exited on its own{code}."
    return _END_REASONS.get(lease.end_reason, lease.get_end_reason_display())
