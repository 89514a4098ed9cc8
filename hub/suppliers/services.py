"""Supplier services: agent tokens and a supplier's own settings (prices, listing, maintenance).
Registration, heartbeats and the offline sweep are the agents' side (hub/agents/)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import timedelta

from channels.exceptions import ChannelFull
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from hub.accounts.models import User
from hub.lib import channel_send, disk_allowance, tokens
from hub.suppliers import transitions
from hub.suppliers.models import AgentToken, Gpu, Host

log = logging.getLogger(__name__)


# --- tokens -------------------------------------------------------------------------------------


def create_agent_token(
    owner: User, name: str = "", *, default_price_per_hour_micros: int | None = None
) -> tuple[AgentToken, str]:
    """Create a token; the plaintext is returned this once and never stored. With a default
    price, GPUs of hosts joining with it are listed at that price when first seen."""
    _check_price(default_price_per_hour_micros)
    plaintext = tokens.generate_token()
    token = AgentToken.objects.create(
        owner=owner,
        name=name[:100],
        prefix=tokens.visible_prefix(plaintext),
        digest=tokens.digest(plaintext),
        default_price_per_hour_micros=default_price_per_hour_micros,
    )
    return token, plaintext


TOKEN_LAST_USED_RESOLUTION = timedelta(minutes=10)


def authenticate_agent_tokens(plaintexts: Iterable[str | None]) -> dict[str, int]:
    """The tokens among these that the database accepts (not revoked, owner active), as digest
    -> token id; two statements at most whatever their number: a reconnect storm's connect-time
    checks come in batches (hub/agents/token_batch.py). Made-up tokens cost no query."""
    digests = {tokens.digest(p) for p in plaintexts if p and tokens.well_formed(p)}
    if not digests:
        return {}
    rows = list(
        AgentToken.objects.filter(
            digest__in=digests, revoked_at__isnull=True, owner__is_active=True
        ).values_list("pk", "digest", "last_used_at")
    )
    now = timezone.now()
    # "Used recently?" is all people read from it: a reconnect storm must not become a storm of
    # token-row writes (docs/benchmarks.md). One update for the batch's stale ones.
    stale = [pk for pk, _, used in rows if used is None or used < now - TOKEN_LAST_USED_RESOLUTION]
    if stale:
        AgentToken.objects.filter(pk__in=stale).update(last_used_at=now)
    return {digest: pk for pk, digest, _ in rows}


def authenticate_agent_token(plaintext: str | None) -> AgentToken | None:
    """One token's row if the database accepts it, else None (authenticate_agent_tokens; the
    agents' socket checks its tokens in batches instead)."""
    accepted = authenticate_agent_tokens([plaintext])
    return AgentToken.objects.get(pk=accepted.popitem()[1]) if accepted else None


def revoke_agent_token(token_id: int) -> bool:
    """Revoke; every live connection using it is closed (through the channel layer)."""
    with transaction.atomic():
        revoked = AgentToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )

    if revoked:
        # Registered sockets through their hosts' channels; a socket that has not registered
        # yet is refused when it does (register_host re-checks the token).
        for channel in (
            Host.objects.filter(token_id=token_id)
            .exclude(channel_name="")
            .values_list("channel_name", flat=True)
        ):
            tell_old_socket(
                channel,
                {"type": "agent.revoked"},
                lambda channel=channel: channel_send.send(channel, {"type": "agent.revoked"}),
            )
    return bool(revoked)


def tell_old_socket(channel: str, message: dict[str, str], send: Callable[[], None]) -> None:
    """Best effort: the socket behind a host's last channel may be gone with a web process that
    stopped. Channels keeps one queue per process for such channels, capped at the layer's
    capacity, so after a restart the first hundred notices fill the dead process's queue and
    every later send raises ChannelFull: re-registrations must not fail on that (measured: a
    reconnect storm of 10,000 agents stalled at a few hundred, docs/benchmarks.md)."""
    try:
        send()
    except (ChannelFull, RedisError, TimeoutError) as exc:
        log.info("%s not delivered to %s: %r", message["type"], channel, exc)


# --- a supplier's own settings (dashboard) --------------------------------------------------------


class SupplierError(Exception):
    """A supplier's change was refused; the message is fit to show them."""


MAX_PRICE_PER_HOUR_MICROS = 1_000 * 1_000_000


def _check_price(price_per_hour_micros: int | None) -> None:
    if price_per_hour_micros is not None and not (
        0 <= price_per_hour_micros <= MAX_PRICE_PER_HOUR_MICROS
    ):
        raise SupplierError("the price must be between $0 and $1,000 per hour")


def set_gpu_terms(
    gpu_id: int,
    *,
    price_per_hour_micros: int | None = None,
    listed: bool | None = None,
    disk_allowance_bytes: int | None = None,
) -> Gpu:
    """A GPU's hourly price, whether it is for rent, and what a rental of it may write on the
    host. Running leases keep the price and disk allowance they started with (hub/billing,
    hub/leases); only new rentals see the change."""
    _check_price(price_per_hour_micros)
    if disk_allowance_bytes is not None:
        refused = disk_allowance.out_of_bounds(disk_allowance_bytes)
        if refused is not None:
            raise SupplierError(refused)
    with transaction.atomic():
        gpu = Gpu.objects.select_for_update(no_key=True).get(pk=gpu_id)
        fields = []
        if price_per_hour_micros is not None:
            gpu.price_per_hour_micros = price_per_hour_micros
            gpu.priced = True
            fields += ["price_per_hour_micros", "priced"]
        if disk_allowance_bytes is not None:
            gpu.disk_allowance_bytes = disk_allowance_bytes
            fields.append("disk_allowance_bytes")
        if listed is not None:
            if listed and not gpu.priced:
                raise SupplierError("set a price for this GPU before putting it up for rent")
            gpu.listed = listed
            fields.append("listed")
            if listed and gpu.unhealthy_since is not None:
                # Its supplier says it is fixed (hub/leases/gpu_faults.py): for rent again.
                gpu.unhealthy_since = None
                gpu.unhealthy_reason = ""
                fields += ["unhealthy_since", "unhealthy_reason"]
        if fields:
            gpu.save(update_fields=fields)
    return gpu


def set_host_default_price(host_id: int, price_per_hour_micros: int | None) -> Host:
    """The price (or None: unlisted until priced) GPUs this host reports for the first time
    get. GPUs already known keep their own terms."""
    _check_price(price_per_hour_micros)
    Host.objects.filter(pk=host_id).update(default_price_per_hour_micros=price_per_hour_micros)
    return Host.objects.get(pk=host_id)


def set_host_maintenance(host_id: int, maintenance: bool, reason: str = "by its supplier") -> Host:
    """In maintenance a host takes no new rentals; running ones go on."""
    transitions.set_maintenance([host_id], maintenance, reason)
    return Host.objects.get(pk=host_id)


def _clean_label(value: str, what: str) -> str:
    text = " ".join(value.split())
    if len(text) > 64:
        raise SupplierError(f"{what} is at most 64 characters")
    if any(not ch.isprintable() for ch in text):
        raise SupplierError(f"{what} has a character that cannot be shown")
    return text


def set_host_details(host_id: int, *, name: str, location: str) -> Host:
    """The supplier's name for a host (empty: its hostname) and where it is (empty: unsaid)."""
    clean_name = _clean_label(name, "a host's name")
    clean_location = _clean_label(location, "a location")
    Host.objects.filter(pk=host_id).update(name=clean_name, location=clean_location)
    return Host.objects.get(pk=host_id)


def record_rtt(host_id: int, rtt_ms: int) -> None:
    """The hub's last ping-to-pong time to this host's agent (one small update per ping)."""
    rtt_ms = max(0, min(int(rtt_ms), 2**31 - 1))
    Host.objects.filter(pk=host_id).exclude(rtt_ms=rtt_ms).update(rtt_ms=rtt_ms)
