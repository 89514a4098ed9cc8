"""The words of each kind's email: a subject, one line per item, and the page to open."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from hub.notifications.kinds import KINDS
from hub.notifications.models import Event

# One line per item (a coalesced kind) or for the event; {field} from the event's data,
# "?" where a field is missing.
LINES: dict[str, str] = {
    "balance.low": (
        "Your balance is {balance} USD, below your threshold of {threshold} USD. Your running "
        "rentals ({rental_names}) cost {burn_per_hour} USD an hour: at this rate they stop "
        "{stops}."
    ),
    "rental.running": "Rental {lease} is running on {host} ({gpus}).",
    "rental.failed": "Rental {lease} failed: {reason}",
    "rental.ended": "Rental {lease} ended ({reason}); it cost {cost} USD.",
    "topup.credited": "A top-up of {amount} USD was credited; your balance is {balance} USD.",
    "host.offline": "Host {name} went offline at {at}.",
    "host.online": "Host {name} is back online since {at}.",
    "gpu.fault": "GPU {gpu} of host {host}: {reason}",
    "gpu.delisted": "GPU {gpu} of host {host} was delisted: {reason}",
    "release.stuck": "Host {host} has not released rental {lease}'s GPUs: {error}",
    "payout.requested": "You asked for a payout of {amount} USD (payout {payout}).",
    "payout.paid": "Payout {payout} of {amount} USD was paid.",
    "payout.refused": "Payout {payout} of {amount} USD was refused: {reason}",
    "security.api_token_created": (
        "A new API token '{name}' ({prefix}…, scopes: {scopes}) was created on your account. "
        "If this was not you, revoke it and change your password."
    ),
    "security.ssh_key_added": (
        "A new SSH key ({fingerprint}, '{comment}') was added to your account. If this was not "
        "you, delete it and change your password."
    ),
    "security.webhook_added": (
        "A new webhook endpoint to {host} (endpoint {endpoint}, events: {kinds}) was added to "
        "your account: it receives your account's events. If this was not you, delete it and "
        "change your password."
    ),
}
# The dashboard page each kind's email links to.
PAGES: dict[str, str] = {
    "balance.low": "/usage/",
    "rental.running": "/leases/",
    "rental.failed": "/leases/",
    "rental.ended": "/leases/",
    "topup.credited": "/usage/",
    "host.offline": "/supplier/hosts/",
    "host.online": "/supplier/hosts/",
    "gpu.fault": "/supplier/hosts/",
    "gpu.delisted": "/supplier/hosts/",
    "release.stuck": "/supplier/hosts/",
    "payout.requested": "/supplier/earnings/",
    "payout.paid": "/supplier/earnings/",
    "payout.refused": "/supplier/earnings/",
    "security.api_token_created": "/account/api-tokens/",
    "security.ssh_key_added": "/account/ssh-keys/",
    "security.webhook_added": "/account/notifications/",
}
# Rentals a balance.low notice names before "and N more".
NAMED_RENTALS = 10


class _Fields(dict[str, Any]):
    missing: set[str]

    def __missing__(self, key: str) -> str:
        self.missing.add(key)
        return "?"


def _rental_names(rentals: Any) -> str:
    if not isinstance(rentals, list) or not rentals:
        return "?"
    names = [str(r.get("lease", "?")) if isinstance(r, dict) else "?" for r in rentals]
    shown, more = names[:NAMED_RENTALS], len(names) - NAMED_RENTALS
    if more > 0:
        return ", ".join(shown) + f" and {more} more"
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _duration(seconds: float) -> str:
    minutes = seconds / 60
    if minutes < 1.5:
        return "about a minute"
    if minutes < 90:
        return f"about {round(minutes)} minutes"
    if minutes < 36 * 60:
        return f"about {round(minutes / 60)} hours"
    return f"about {round(minutes / 1440)} days"


def _stops(runs_out_at: Any, told_at: datetime) -> str:
    """A person's words for when the balance runs out (the data keeps the ISO time, for
    programs): the UTC time and how long after the notice, as the notice may be read late."""
    try:
        at = datetime.fromisoformat(str(runs_out_at))
    except ValueError:
        return "?"
    when = at.strftime("%H:%M UTC on %-d %B %Y")
    left = (at - told_at).total_seconds()
    if left <= 60:
        return f"now ({when})"
    return f"around {when}, {_duration(left)} after this notice"


def _fields(event: Event) -> dict[str, Any]:
    """The event's data and, for balance.low, the words made from it."""
    if event.kind != "balance.low":
        return event.data
    return {
        **event.data,
        "rental_names": _rental_names(event.data.get("rentals")),
        "stops": _stops(event.data.get("runs_out_at"), event.created_at),
    }


def _line(kind: str, fields: dict[str, Any], missing: set[str] | None = None) -> str:
    values = _Fields(
        {k: ", ".join(map(str, v)) if isinstance(v, list) else v for k, v in fields.items()}
    )
    values.missing = missing if missing is not None else set()
    return LINES[kind].format_map(values)


def subject(event: Event) -> str:
    title = KINDS[event.kind].title
    count = int(event.data.get("count", 1)) if KINDS[event.kind].coalesce else 1
    return f"CloudGPU: {title}" + (f" ({count})" if count > 1 else "")


def lines(event: Event) -> list[str]:
    if not KINDS[event.kind].coalesce:
        return [_line(event.kind, _fields(event))]
    items = event.data.get("items", [])
    out = [_line(event.kind, item) for item in items if isinstance(item, dict)]
    more = int(event.data.get("count", len(items))) - len(items)
    if more > 0:
        out.append(f"… and {more} more.")
    return out


def page(event: Event) -> str:
    return PAGES[event.kind]


def missing_fields(event: Event) -> set[str]:
    """The fields the kind's words name that the event's data lacks (shown as "?"): a test
    checks that every emitter fills every one."""
    missing: set[str] = set()
    if not KINDS[event.kind].coalesce:
        _line(event.kind, _fields(event), missing)
    else:
        for item in event.data.get("items", []):
            _line(event.kind, item, missing)
    return missing
