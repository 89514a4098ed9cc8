"""The events an account hears about: each kind's audience, how a burst of it is coalesced,
and the words its email uses. A webhook gets every kind its endpoint subscribes to."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    title: str  # for the preferences page and the subject line
    audience: str  # "renter", "supplier" or "everyone": which accounts' pages list it
    coalesce: bool = False  # a burst within NOTIFY_COALESCE_S becomes one event of many items
    # False for security notices: a stolen session that could mute them could then add a
    # token or an endpoint unseen, so their email is always sent.
    can_mute: bool = True


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("balance.low", "Balance below your threshold", "renter"),
        Kind("rental.running", "Rental running", "renter", coalesce=True),
        Kind("rental.failed", "Rental failed", "renter", coalesce=True),
        Kind("rental.ended", "Rental ended", "renter", coalesce=True),
        Kind("topup.credited", "Top-up credited", "renter"),
        Kind("host.offline", "Host offline", "supplier", coalesce=True),
        Kind("host.online", "Host back online", "supplier", coalesce=True),
        Kind("gpu.fault", "GPU fault", "supplier", coalesce=True),
        Kind("gpu.delisted", "GPU delisted", "supplier", coalesce=True),
        Kind("release.stuck", "Release stuck", "supplier", coalesce=True),
        Kind("payout.requested", "Payout requested", "supplier"),
        Kind("payout.paid", "Payout paid", "supplier"),
        Kind("payout.refused", "Payout refused", "supplier"),
        Kind("security.api_token_created", "New API token", "everyone", can_mute=False),
        Kind("security.ssh_key_added", "New SSH key", "everyone", can_mute=False),
        Kind("security.webhook_added", "New webhook endpoint", "everyone", can_mute=False),
    )
}
# Sent only by the account page's "send test event" button, to one endpoint, never by email.
TEST_KIND = "webhook.test"
