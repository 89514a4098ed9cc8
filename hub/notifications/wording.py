"""The words of each kind's email: a subject, one line per item, and the page to open."""

from __future__ import annotations

from typing import Any

from hub.notifications.kinds import KINDS
from hub.notifications.models import Event

# One line per item (a coalesced kind) or for the event; {field} from the event's data,
# "?" where a field is missing.
LINES: dict[str, str] = {
    "balance.low": (
        "Your balance is {balance} USD, below your threshold of {threshold} USD. Your running "
        "rentals cost {burn_per_hour} USD an hour: at this rate they stop at {runs_out_at}."
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
}


class _Fields(dict[str, Any]):
    missing: set[str]

    def __missing__(self, key: str) -> str:
        self.missing.add(key)
        return "?"


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
        return [_line(event.kind, event.data)]
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
        _line(event.kind, event.data, missing)
    else:
        for item in event.data.get("items", []):
            _line(event.kind, item, missing)
    return missing
