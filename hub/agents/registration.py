"""An agent's registration: its token checked, its host and GPUs upserted, the host online,
and what it should hold (claims, pre-pulls) answered; and the channel forgotten when its socket
closes. Called by the agent socket (consumer.py)."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from hub.agents import storm
from hub.agents.stats import pg_offline_after
from hub.catalog.prepull import images_fitting
from hub.leases.models import Lease
from hub.leases.services import hosts_with_leases_to_reconcile, reconcile_claims
from hub.lib.versions import version_number
from hub.suppliers import liveness, transitions
from hub.suppliers.models import AgentToken, Gpu, Host
from hub.suppliers.services import tell_old_socket
from hub.volumes import services as volume_services
from supplier_agent.protocol import GpuState, Register

log = logging.getLogger(__name__)


class RegistrationRefused(Exception):
    """The agent may not register (e.g. its id belongs to another supplier)."""


@dataclass(frozen=True)
class Registered:
    host_id: int
    desired_claims: tuple[str, ...]
    prepull_images: tuple[str, ...] = ()
    # Volume deletes the agent has not confirmed (it was away, or the frame was lost): again.
    pending_frames: tuple[str, ...] = ()


def probe_registration(token_id: int, message: Register) -> str:
    """What a registration would answer, without any change: the host id, or "new". The token
    is read again, as register_host does: the socket's connect-time check may have come from
    this process's cache (hub/agents/token_cache.py)."""
    token = AgentToken.objects.select_related("owner").get(pk=token_id)
    if token.revoked_at is not None or not token.owner.is_active:
        raise RegistrationRefused("this agent token was revoked")
    host = Host.objects.filter(agent_id=message.agent_id).first()
    if host is None:
        return "new"
    if host.owner_id != token.owner_id:
        raise RegistrationRefused("this agent id is registered to another supplier")
    return str(host.pk)


def register_host(token_id: int, message: Register, channel_name: str) -> Registered:
    """A bounded number of statements whatever the fleet's size or the host's GPU count (a
    reconnect storm is thousands of these a minute; tests/hub/agents/test_registration_cost.py):
    the token, the host's locked row, one write of it, one upsert of all its GPUs, one update of
    the GPUs it no longer reports, and for a host seen before one look for leases and one for
    pending volume deletes. A new host adds its cap check and its transition row."""
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
        is_new = host is None
        if host is None:
            _refuse_over_cap(token)
            host = Host(owner=token.owner, agent_id=message.agent_id, status=Host.Status.OFFLINE)
        previous_channel = host.channel_name
        _apply(host, token, message, channel_name, now)
        transitions.set_online(host, "agent registered")  # saves a new host (it needs an id)
        if not is_new:
            host.save()
        default_price = host.default_price_per_hour_micros
        if default_price is None:
            default_price = token.default_price_per_hour_micros
        _upsert_gpus(host, message.gpus, now, default_price, is_new=is_new)
        # A new host has no leases and no volumes: nothing to reconcile or re-send.
        desired = () if is_new else reconcile_claims(host, message.claims, now)
        pending = () if is_new else tuple(volume_services.pending_deletes(host.pk))
        # Before the commit that makes the host online: the offline sweep must never see the
        # new status next to the old deadline.
        # One round trip: the deadline, and for a host seen before the count the offline
        # sweep reads to tell a reconnect storm from failures (storm.py).
        with liveness.sync_client().pipeline(transaction=False) as pipe:
            now_ts = time.time()
            pipe.zadd(
                liveness.liveness_key(), {str(host.pk): now_ts + settings.HOST_OFFLINE_AFTER_S}
            )
            if not is_new:
                storm.count_reregistration(pipe, now_ts)
            pipe.execute()
    if previous_channel and previous_channel != channel_name:
        # Called from the agent socket's own loop (through database_sync_to_async), where
        # async_to_sync reuses that loop and its Redis pool.
        tell_old_socket(
            previous_channel,
            {"type": "agent.superseded"},
            lambda: async_to_sync(get_channel_layer().send)(
                previous_channel, {"type": "agent.superseded"}
            ),
        )
    largest = max((gpu.memory_total_bytes for gpu in message.gpus), default=0)
    return Registered(
        host_id=host.pk,
        desired_claims=desired,
        prepull_images=images_fitting(largest),
        pending_frames=pending,
    )


# What a registration writes on a host row it already has (the batch's one UPDATE).
_HOST_FIELDS = [
    "machine_id",
    "token",
    "hostname",
    "os",
    "arch",
    "cpu_model",
    "cpu_count",
    "ram_bytes",
    "disk_free_bytes",
    "driver_version",
    "cuda_version",
    "cuda_key",
    "agent_version",
    "runtime",
    "last_seen_at",
    "offline_after",
    "channel_name",
]


def _apply(
    host: Host, token: AgentToken, message: Register, channel_name: str, now: datetime
) -> None:
    host.machine_id = message.machine_id or host.machine_id
    host.token = token
    for field in ("hostname", "os", "arch", "cpu_model", "cpu_count", "ram_bytes"):
        setattr(host, field, getattr(message, field))
    # Measured by newer agents only: an older one's register leaves them unknown, not stale.
    host.disk_free_bytes = message.disk_free_bytes
    host.driver_version = message.driver_version
    host.cuda_version = message.cuda_version
    host.cuda_key = version_number(message.cuda_version)
    host.agent_version = message.agent_version
    host.runtime = message.runtime
    host.last_seen_at = now
    host.offline_after = pg_offline_after(now)
    host.channel_name = channel_name


# Postgres types of _HOST_FIELDS for the VALUES list of _update_hosts.
_HOST_FIELD_TYPES = {
    "machine_id": "text",
    "token": "bigint",
    "hostname": "text",
    "os": "text",
    "arch": "text",
    "cpu_model": "text",
    "cpu_count": "integer",
    "ram_bytes": "bigint",
    "disk_free_bytes": "bigint",
    "driver_version": "text",
    "cuda_version": "text",
    "cuda_key": "integer",
    "agent_version": "text",
    "runtime": "text",
    "last_seen_at": "timestamptz",
    "offline_after": "timestamptz",
    "channel_name": "text",
}


def _update_hosts(hosts: list[Host]) -> None:
    """One ``UPDATE ... FROM (VALUES ...)`` for a batch's host rows. Django's bulk_update
    writes a CASE per field and row instead: measured as most of a batch's Python time."""
    fields = [Host._meta.get_field(name) for name in _HOST_FIELDS]
    columns = [field.column for field in fields]  # type: ignore[union-attr]
    row = "(%s::bigint, " + ", ".join(f"%s::{_HOST_FIELD_TYPES[n]}" for n in _HOST_FIELDS) + ")"
    params: list[object] = []
    for host in hosts:
        params.append(host.pk)
        params += [getattr(host, field.attname) for field in fields]  # type: ignore[union-attr]
    quote = connection.ops.quote_name
    sets = ", ".join(f"{quote(c)} = v.{quote(c)}" for c in columns)
    # Only the model's own table and column names are formatted in; every value is a parameter.
    sql = (
        f"UPDATE {quote(Host._meta.db_table)} AS h SET {sets} "  # noqa: S608
        f"FROM (VALUES {', '.join([row] * len(hosts))}) "
        f"AS v(id, {', '.join(quote(c) for c in columns)}) WHERE h.id = v.id"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


@dataclass(frozen=True)
class Request:
    """One socket's registration, for ``register_many``."""

    token_id: int
    message: Register
    channel_name: str


@dataclass(frozen=True)
class BatchResult:
    """Per request, in order: what it answers, or why it was refused (or failed)."""

    outcomes: list[Registered | Exception]
    # Channels of sockets that these registrations replaced: the caller tells them (best
    # effort, from its event loop), as register_host does itself.
    superseded: list[str]


def register_many(requests: list[Request]) -> BatchResult:
    """Many registrations at once, as a reconnect storm brings them: the common case (a host
    that is online with this token on this machine, each agent id once in the batch) in one
    transaction of set-based statements, whatever the batch's size: the tokens, the hosts'
    locked rows, one UPDATE of them all, one upsert of all their GPUs, one UPDATE of the GPUs
    they no longer report, one look for leases and one for pending volume deletes, one Redis
    pipeline. Everything else (a new host, a takeover, a refusal, a host with leases to
    reconcile, a batch that failed) goes through ``register_host`` one by one, so every rule
    stays in one place."""
    outcomes: list[Registered | Exception | None] = [None] * len(requests)
    superseded: list[str] = []
    try:
        fast = _register_fast(requests, outcomes, superseded)
    except Exception:
        log.exception("a batch of %d registrations failed; registering one by one", len(requests))
        outcomes = [None] * len(requests)
        superseded = []
        fast = set()
    for position, request in enumerate(requests):
        if position in fast:
            continue
        try:
            outcomes[position] = register_host(
                request.token_id, request.message, request.channel_name
            )
        except Exception as exc:
            outcomes[position] = exc
    return BatchResult(
        [o if o is not None else RuntimeError("not registered") for o in outcomes], superseded
    )


def _register_fast(
    requests: list[Request],
    outcomes: list[Registered | Exception | None],
    superseded: list[str],
) -> set[int]:
    """The common case of ``register_many``; returns the positions it answered."""
    now = timezone.now()
    agent_ids: dict[int, str] = {}  # position -> the agent id as the database spells it
    for position, request in enumerate(requests):
        try:
            agent_ids[position] = str(uuid.UUID(request.message.agent_id))
        except ValueError:
            continue  # register_host refuses it, alone
    counts: dict[str, int] = {}
    for agent_id in agent_ids.values():
        counts[agent_id] = counts.get(agent_id, 0) + 1
    with transaction.atomic():
        tokens = {
            t.pk: t
            for t in AgentToken.objects.select_related("owner").filter(
                pk__in={r.token_id for r in requests}
            )
        }
        # Locked in primary-key order, as every batch does: two batches never deadlock.
        hosts = {
            str(h.agent_id): h
            for h in Host.objects.select_for_update(no_key=True)
            .filter(agent_id__in=list(agent_ids.values()))
            .order_by("pk")
        }
        chosen: dict[int, tuple[Request, Host, AgentToken]] = {}
        for position, request in enumerate(requests):
            agent_id = agent_ids.get(position)
            token = tokens.get(request.token_id)
            host = hosts.get(agent_id) if agent_id is not None else None
            machine = request.message.machine_id
            if (
                agent_id is None
                or token is None
                or token.revoked_at is not None
                or not token.owner.is_active
                or host is None
                or counts[agent_id] > 1
                or host.owner_id != token.owner_id
                or host.token_id != token.pk
                or host.status != Host.Status.ONLINE
                or (machine and host.machine_id and machine != host.machine_id)
            ):
                continue
            chosen[position] = (request, host, token)
        if not chosen:
            return set()
        host_ids = [host.pk for _, host, _ in chosen.values()]
        with_leases = hosts_with_leases_to_reconcile(host_ids)
        # Leases to reconcile are the rare case: those hosts go one by one.
        chosen = {p: c for p, c in chosen.items() if c[1].pk not in with_leases}
        if not chosen:
            return set()
        previous = {}
        gpus = []
        reported: dict[int, list[int]] = {}
        for request, host, token in chosen.values():
            previous[host.pk] = host.channel_name
            _apply(host, token, request.message, request.channel_name, now)
            default_price = host.default_price_per_hour_micros
            if default_price is None:
                default_price = token.default_price_per_hour_micros
            gpus += [_reported_gpu(host, g, now, default_price) for g in request.message.gpus]
            reported[host.pk] = [g.index for g in request.message.gpus]
        _update_hosts([host for _, host, _ in chosen.values()])
        if gpus:
            Gpu.objects.bulk_create(
                gpus,
                update_conflicts=True,
                unique_fields=["host", "index"],
                update_fields=_GPU_REPORTED_FIELDS,
            )
        absent = Q()
        for host_id, indexes in reported.items():
            absent |= Q(host_id=host_id) & ~Q(index__in=indexes)
        Gpu.objects.filter(absent, host_id__in=list(reported), present=True).update(present=False)
        pending: dict[int, list[str]] = {}
        for host_id, frame in volume_services.pending_deletes_of(list(reported)):
            pending.setdefault(host_id, []).append(frame)
        with liveness.sync_client().pipeline(transaction=False) as pipe:
            now_ts = time.time()
            pipe.zadd(
                liveness.liveness_key(),
                {str(h): now_ts + settings.HOST_OFFLINE_AFTER_S for h in reported},
            )
            for _ in reported:
                storm.count_reregistration(pipe, now_ts)
            pipe.execute()
    for position, (request, host, _) in chosen.items():
        old = previous[host.pk]
        if old and old != request.channel_name:
            superseded.append(old)
        largest = max((gpu.memory_total_bytes for gpu in request.message.gpus), default=0)
        outcomes[position] = Registered(
            host_id=host.pk,
            desired_claims=(),
            prepull_images=images_fitting(largest),
            pending_frames=tuple(pending.get(host.pk, ())),
        )
    return set(chosen)


def _refuse_over_cap(token: AgentToken) -> None:
    cap = settings.MAX_HOSTS_PER_TOKEN
    # Counted up to the cap only: the work stays bounded however many hosts the token holds.
    if Host.objects.filter(token=token)[:cap].count() >= cap:
        raise RegistrationRefused(
            f"this agent token already holds {cap} hosts "
            "(MAX_HOSTS_PER_TOKEN); create another token for more machines"
        )


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


# What a registration rewrites on a GPU it already knows; the price and listing are its
# owner's and are set only when the GPU is first seen.
_GPU_REPORTED_FIELDS = [
    "uuid",
    "name",
    "present",
    "memory_total_bytes",
    "memory_used_bytes",
    "utilization_pct",
    "processes",
    "stats_updated_at",
]


def _upsert_gpus(
    host: Host,
    gpus: tuple[GpuState, ...],
    now: datetime,
    default_price: int | None,
    *,
    is_new: bool,
) -> None:
    """All the reported GPUs in one INSERT ... ON CONFLICT (host, index) DO UPDATE; those the
    host no longer reports in one UPDATE (they stay for history but cannot be rented)."""
    if gpus:
        Gpu.objects.bulk_create(
            [_reported_gpu(host, state, now, default_price) for state in gpus],
            update_conflicts=True,
            unique_fields=["host", "index"],
            update_fields=_GPU_REPORTED_FIELDS,
        )
    if not is_new:
        Gpu.objects.filter(host=host, present=True).exclude(
            index__in=[state.index for state in gpus]
        ).update(present=False)


def _reported_gpu(host: Host, state: GpuState, now: datetime, default_price: int | None) -> Gpu:
    """The row as reported; a GPU seen for the first time is listed at the host's (or else its
    token's) default price if its owner set one, otherwise unlisted and unpriced until they do
    (never for rent at $0 by accident)."""
    if default_price is None:
        gpu = Gpu(host=host, index=state.index, listed=False, priced=False)
    else:
        gpu = Gpu(
            host=host,
            index=state.index,
            listed=True,
            priced=True,
            price_per_hour_micros=default_price,
        )
    gpu.uuid = state.uuid
    gpu.name = state.name
    gpu.present = True
    gpu.memory_total_bytes = state.memory_total_bytes
    gpu.memory_used_bytes = state.memory_used_bytes
    gpu.utilization_pct = state.utilization_pct
    gpu.processes = [
        {"pid": p.pid, "name": p.name, "memory_bytes": p.memory_bytes} for p in state.processes
    ]
    gpu.stats_updated_at = now
    return gpu


def detach_channel(host_id: int, channel_name: str) -> None:
    """The connection closed; forget its channel unless a newer connection already took over."""
    Host.objects.filter(pk=host_id, channel_name=channel_name).update(channel_name="")
