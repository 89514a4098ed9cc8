"""Supplier services: agent tokens, host registration, heartbeats, offline detection."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from redis.exceptions import RedisError

from hub.accounts.models import User
from hub.catalog.prepull import images_for
from hub.leases.models import Lease
from hub.leases.services import reconcile_claims
from hub.lib import channel_send, tokens
from hub.suppliers import liveness, transitions
from hub.suppliers.models import AgentToken, Gpu, Host
from hub.suppliers.stats import pg_offline_after
from supplier_agent.protocol import GpuState, Register

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


def authenticate_agent_token(plaintext: str | None) -> AgentToken | None:
    if not plaintext or not tokens.well_formed(plaintext):
        return None  # a mistyped or made-up token costs no query
    token = (
        AgentToken.objects.select_related("owner")
        .filter(digest=tokens.digest(plaintext), revoked_at__isnull=True)
        .first()
    )
    if token is None or not token.owner.is_active:
        return None
    now = timezone.now()
    # "Used recently?" is all people read from it: a reconnect storm must not become a storm of
    # token-row writes queued on the web process's one database thread (docs/benchmarks.md).
    if token.last_used_at is None or token.last_used_at < now - TOKEN_LAST_USED_RESOLUTION:
        AgentToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


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
            _tell_old_socket(
                channel,
                {"type": "agent.revoked"},
                lambda channel=channel: channel_send.send(channel, {"type": "agent.revoked"}),
            )
    return bool(revoked)


def _tell_old_socket(channel: str, message: dict[str, str], send: Callable[[], None]) -> None:
    """Best effort: the socket behind a host's last channel may be gone with a web process that
    stopped. Channels keeps one queue per process for such channels, capped at the layer's
    capacity, so after a restart the first hundred notices fill the dead process's queue and
    every later send raises ChannelFull: re-registrations must not fail on that (measured: a
    reconnect storm of 10,000 agents stalled at a few hundred, docs/benchmarks.md)."""
    try:
        send()
    except (ChannelFull, RedisError, TimeoutError) as exc:
        log.info("%s not delivered to %s: %r", message["type"], channel, exc)


# --- registration -------------------------------------------------------------------------------


class RegistrationRefused(Exception):
    """The agent may not register (e.g. its id belongs to another supplier)."""


@dataclass(frozen=True)
class Registered:
    host_id: int
    desired_claims: tuple[str, ...]
    prepull_images: tuple[str, ...] = ()


def probe_registration(token_id: int, message: Register) -> str:
    """What a registration would answer, without any change: the host id, or "new"."""
    token = AgentToken.objects.get(pk=token_id)
    host = Host.objects.filter(agent_id=message.agent_id).first()
    if host is None:
        return "new"
    if host.owner_id != token.owner_id:
        raise RegistrationRefused("this agent id is registered to another supplier")
    return str(host.pk)


def register_host(token_id: int, message: Register, channel_name: str) -> Registered:
    now = timezone.now()
    with transaction.atomic():
        token = AgentToken.objects.select_related("owner").get(pk=token_id)
        if token.revoked_at is not None or not token.owner.is_active:
            raise RegistrationRefused("this agent token was revoked")
        host = Host.objects.select_for_update(no_key=True).filter(agent_id=message.agent_id).first()
        if host is not None and host.owner_id != token.owner_id:
            raise RegistrationRefused("this agent id is registered to another supplier")
        if host is not None:
            _refuse_takeover(host, token.pk, message.machine_id)
        if host is None:
            if Host.objects.filter(token=token).count() >= settings.MAX_HOSTS_PER_TOKEN:
                raise RegistrationRefused(
                    f"this agent token already holds {settings.MAX_HOSTS_PER_TOKEN} hosts "
                    "(MAX_HOSTS_PER_TOKEN); create another token for more machines"
                )
            host = Host(owner=token.owner, agent_id=message.agent_id, status=Host.Status.OFFLINE)
        host.machine_id = message.machine_id or host.machine_id
        host.token = token
        for field in ("hostname", "os", "arch", "cpu_model", "cpu_count", "ram_bytes"):
            setattr(host, field, getattr(message, field))
        host.agent_version = message.agent_version
        host.runtime = message.runtime
        host.last_seen_at = now
        host.offline_after = pg_offline_after(now)
        previous_channel = host.channel_name
        host.channel_name = channel_name
        is_new = host.pk is None
        if is_new:
            host.save()
        transitions.set_online(host, "agent registered")
        host.save()
        _upsert_gpus(host, message.gpus, now)
        desired = reconcile_claims(host, message.claims, now)
        # Before the commit that makes the host online: the offline sweep must never see the
        # new status next to the old deadline.
        liveness.sync_client().zadd(
            liveness.liveness_key(), {str(host.pk): time.time() + settings.HOST_OFFLINE_AFTER_S}
        )
    if previous_channel and previous_channel != channel_name:
        # Called from the agent socket's own loop (through database_sync_to_async), where
        # async_to_sync reuses that loop and its Redis pool.
        _tell_old_socket(
            previous_channel,
            {"type": "agent.superseded"},
            lambda: async_to_sync(get_channel_layer().send)(
                previous_channel, {"type": "agent.superseded"}
            ),
        )
    return Registered(host_id=host.pk, desired_claims=desired, prepull_images=images_for(host.pk))


def _refuse_takeover(host: Host, token_id: int, machine_id: str) -> None:
    """Only the machine that holds an agent id speaks for it. Another token or machine may take
    it over only once the holder's socket is gone, and another machine only once no rental is
    left on the host: a copied state folder (or a second token of the same supplier) must never
    end the rentals of the machine that really runs them."""
    other_token = host.token_id is not None and host.token_id != token_id
    other_machine = bool(machine_id and host.machine_id and machine_id != host.machine_id)
    if not (other_token or other_machine):
        return
    if _held_by_live_socket(host):
        raise RegistrationRefused(
            "agent id in use on another machine"
            + (" with another token" if other_token and not other_machine else "")
            + ": was the agent's state folder copied? Each machine needs its own state folder "
            "(run `cloudgpu-agent configure` with a fresh --state there)"
        )
    if other_machine and Lease.objects.filter(host=host, state__in=Lease.ACTIVE_STATES).exists():
        raise RegistrationRefused(
            "agent id belongs to another machine, whose rentals are still active on the "
            "hub: was the agent's state folder copied? Give this machine its own state "
            "folder; the agent id moves only once those rentals have ended"
        )


def _held_by_live_socket(host: Host) -> bool:
    if not host.channel_name or host.status != Host.Status.ONLINE:
        return False
    deadline = liveness.deadline_of(host.pk)
    if deadline is not None:
        return deadline > time.time()
    return host.offline_after is not None and host.offline_after > timezone.now()


def _upsert_gpus(host: Host, gpus: tuple[GpuState, ...], now: datetime) -> None:
    existing = {
        gpu.index: gpu for gpu in Gpu.objects.select_for_update(no_key=True).filter(host=host)
    }
    for state in gpus:
        gpu = existing.pop(state.index, None) or _new_gpu(host, state.index)
        gpu.uuid = state.uuid
        gpu.name = state.name
        gpu.present = True
        _apply_telemetry(gpu, state, now)
        gpu.save()
    # GPUs the host no longer reports stay for history but cannot be rented.
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in existing.values()]).update(present=False)


def _new_gpu(host: Host, index: int) -> Gpu:
    """A GPU seen for the first time: listed at the host's default price if its owner set
    one, otherwise unlisted and unpriced until they do (never for rent at $0 by accident)."""
    default = host.default_price_per_hour_micros
    if default is None and host.token_id is not None:
        default = (
            AgentToken.objects.filter(pk=host.token_id)
            .values_list("default_price_per_hour_micros", flat=True)
            .first()
        )
    if default is None:
        return Gpu(host=host, index=index, listed=False, priced=False)
    return Gpu(host=host, index=index, listed=True, priced=True, price_per_hour_micros=default)


def _apply_telemetry(gpu: Gpu, state: GpuState, now: datetime) -> None:
    gpu.memory_total_bytes = state.memory_total_bytes
    gpu.memory_used_bytes = state.memory_used_bytes
    gpu.utilization_pct = state.utilization_pct
    gpu.processes = [
        {"pid": p.pid, "name": p.name, "memory_bytes": p.memory_bytes} for p in state.processes
    ]
    gpu.stats_updated_at = now


def detach_channel(host_id: int, channel_name: str) -> None:
    """The connection closed; forget its channel unless a newer connection already took over."""
    Host.objects.filter(pk=host_id, channel_name=channel_name).update(channel_name="")


# --- offline sweep ------------------------------------------------------------------------------

SWEEP_BATCH = 500


def mark_overdue_hosts_offline(now: datetime | None = None) -> list[int]:
    """Hosts whose deadline passed go offline, each with a transition row (compare-and-set)."""
    now = now or timezone.now()
    now_ts = now.timestamp()
    # After a Redis restart or a gap in the sweeps, Redis may lack heartbeats that Postgres
    # got: then both deadlines must have passed (late, never early; liveness.py).
    redis_trusted = liveness.redis_trusted(now_ts)
    candidates = set(liveness.overdue(now_ts, SWEEP_BATCH))
    candidates.update(
        Host.objects.filter(status=Host.Status.ONLINE, offline_after__lt=now).values_list(
            "pk", flat=True
        )[:SWEEP_BATCH]
    )
    if not redis_trusted:
        candidates = set(
            Host.objects.filter(pk__in=candidates, offline_after__lt=now).values_list(
                "pk", flat=True
            )
        )
    went_offline = []
    for host_id in sorted(candidates):
        deadline = liveness.deadline_of(host_id)
        if deadline is not None and deadline > now_ts:
            continue  # Redis has a fresher heartbeat than Postgres
        reason = f"no heartbeat for {settings.HOST_OFFLINE_AFTER_S} s"
        if transitions.mark_offline(host_id, reason, now):
            went_offline.append(host_id)
            _tell_socket_marked_offline(host_id)
        liveness.forget_if_overdue(host_id, now_ts)
    return went_offline


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
    gpu_id: int, *, price_per_hour_micros: int | None = None, listed: bool | None = None
) -> Gpu:
    """A GPU's hourly price and whether it is for rent. Running leases keep the price they
    started with (hub/billing); only new rentals see the change."""
    _check_price(price_per_hour_micros)
    with transaction.atomic():
        gpu = Gpu.objects.select_for_update(no_key=True).get(pk=gpu_id)
        fields = []
        if price_per_hour_micros is not None:
            gpu.price_per_hour_micros = price_per_hour_micros
            gpu.priced = True
            fields += ["price_per_hour_micros", "priced"]
        if listed is not None:
            if listed and not gpu.priced:
                raise SupplierError("set a price for this GPU before putting it up for rent")
            gpu.listed = listed
            fields.append("listed")
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


def _tell_socket_marked_offline(host_id: int) -> None:
    """If the host's socket is still open (a stalled agent, a slow network), its next heartbeat
    brings it back at once instead of at the next telemetry flush (heartbeats.py)."""
    channel = Host.objects.filter(pk=host_id).values_list("channel_name", flat=True).first()
    if channel:
        channel_send.send(channel, {"type": "agent.marked_offline"})
