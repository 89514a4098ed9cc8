"""Lease services: every lease transition happens here, under a row lock or compare-and-set.

pending -> reserving -> starting -> running -> stopping -> ended, or failed (never ran).
Commands to agents are rows (the outbox) created in the same transaction as the transition and
sent by a Celery task queued on commit; agents de-duplicate by command id.
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from hub.accounts.models import User
from hub.billing import metering
from hub.billing import services as billing
from hub.billing.models import LedgerEntry
from hub.billing.money import format_micros, format_rate
from hub.celery import app as celery_app
from hub.leases import cache_volumes, commands
from hub.leases.models import Command, Lease, LeaseGpu
from hub.lib import metrics
from hub.notifications.events import emit
from hub.suppliers.models import Gpu, Host
from hub.tunnels import services as tunnels
from hub.volumes.services import VolumeError, note_mounted
from supplier_agent.host_paths import redact_host_paths
from supplier_agent.protocol import Ack, ClaimState, ContainerExited, LeaseNotice
from supplier_agent.protocol import Command as CommandMessage

log = logging.getLogger(__name__)

State = Lease.State


class LeaseError(Exception):
    """A lease cannot be started or changed; the message is fit to show the renter."""


class PriceChanged(LeaseError):
    """The GPUs cost more now than the most the renter agreed to pay (what they saw)."""

    def __init__(self, price_per_hour_micros: int, max_price_per_hour_micros: int) -> None:
        self.price_per_hour_micros = price_per_hour_micros
        self.max_price_per_hour_micros = max_price_per_hour_micros
        super().__init__(
            "the price changed: these GPUs now cost "
            f"{format_rate(price_per_hour_micros)} an hour, more than the "
            f"{format_rate(max_price_per_hour_micros)} you agreed to; "
            "rent again to accept the new price"
        )


@dataclass(frozen=True)
class LeaseSpec:
    image: str
    ports: list[int] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None
    entrypoint: list[str] | None = None
    user: str = ""
    cache_volume: dict[str, str] | None = None
    # Wire mounts of the renter's volumes (hub/volumes/services.py wire_mounts), checked there.
    volumes: list[dict[str, Any]] = field(default_factory=list)
    warmup: list[str] | None = None
    # Tunnel URLs need the lease's access token, not just the address.
    access_protected: bool = False
    # Keep-alive limit: the lease is released (expired) this long after it was rented.
    stop_after: timedelta | None = None


# --- commands (outbox) --------------------------------------------------------------------------


RELEASE_RETRY_S = 60
# hub/leases/tasks.py dispatch_command (tests/hub/leases/test_lease_services.py checks the name).
DISPATCH_TASK = "leases.dispatch_command"


def _queue_command(lease: Lease, message: CommandMessage, *, delay_s: int = 0) -> Command:
    # Checked against the agent's parser first (commands.payload): a command it would refuse
    # raises here, before the row is written, and rolls back the transition that wanted it.
    payload = commands.payload(message)
    now = timezone.now()
    kind = message.TYPE
    command = Command(
        id=uuid.UUID(message.command_id),
        lease=lease,
        host_id=lease.host_id,
        kind=kind,
        payload=payload,
        next_attempt_at=now + timedelta(seconds=delay_s),
    )
    command.deadline = now + timedelta(seconds=settings.COMMAND_DEADLINES_S[kind])
    command.save()
    # Celery's delay_on_commit, made robust: with the broker down the row still commits and
    # the redispatch sweep sends it later, instead of the renter's request failing. Sent by
    # name, through the hub's own Celery app: the task module (hub/leases/tasks.py) builds on
    # this one, not the other way round. ignore_result: send_task does not know the task's own
    # setting, and would otherwise subscribe this thread to a result nobody reads (the result
    # backend keeps one Redis connection per thread for that: three in a web process).
    command_id = str(command.id)
    if not delay_s:
        transaction.on_commit(
            lambda: celery_app.send_task(DISPATCH_TASK, args=[command_id], ignore_result=True),
            robust=True,
        )
    return command


# --- start --------------------------------------------------------------------------------------


def _next_epoch() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval('leases_epoch_seq')")
        return int(cursor.fetchone()[0])


def start_lease(
    renter: User,
    host: Host,
    gpu_indices: list[int],
    spec: LeaseSpec,
    *,
    max_price_per_hour_micros: int | None = None,
) -> Lease:
    """Grant GPUs of one host to a renter and queue the reserve. Exactly one of two racing
    renters gets a GPU: the rows are locked in pk order and a partial unique index backs it.

    ``max_price_per_hour_micros`` is the price the renter saw: a GPU repriced above it since
    is refused with ``PriceChanged``, never rented at the new price behind their back."""
    if not gpu_indices or len(gpu_indices) > 64 or len(set(gpu_indices)) != len(gpu_indices):
        raise LeaseError("choose between 1 and 64 distinct GPUs")
    try:
        with transaction.atomic():
            # One rent at a time per renter (lock order: renter, host, GPUs, lease): two
            # simultaneous rents each counting the other's burn cannot both pass the funds
            # check on money only enough for one.
            User.objects.select_for_update(no_key=True).only("pk").get(pk=renter.pk)
            host = Host.objects.select_for_update(no_key=True).get(pk=host.pk)
            if host.status != Host.Status.ONLINE:
                raise LeaseError("this host is offline")
            if host.maintenance:
                raise LeaseError("this host is in maintenance and takes no new rentals")
            if host.release_stuck_since is not None:
                raise LeaseError(
                    "this host takes no new rentals: it has not been able to release an "
                    "earlier rental"
                )
            gpus = list(
                Gpu.objects.select_for_update(no_key=True)
                .filter(host=host, index__in=gpu_indices)
                .order_by("pk")
            )
            if len(gpus) != len(gpu_indices):
                raise LeaseError("this host does not have all of those GPUs")
            for gpu in gpus:
                if not (gpu.listed and gpu.priced and gpu.present):
                    raise LeaseError(f"GPU {gpu.index} is not for rent")
            if LeaseGpu.objects.filter(gpu__in=gpus, active=True).exists():
                raise LeaseError("that GPU was just rented by someone else")
            # The price is fixed now: a supplier's later price change never reaches this lease.
            price_per_hour_micros = sum(gpu.price_per_hour_micros for gpu in gpus)
            if (
                max_price_per_hour_micros is not None
                and price_per_hour_micros > max_price_per_hour_micros
            ):
                raise PriceChanged(price_per_hour_micros, max_price_per_hour_micros)
            billing.require_funds_to_start(renter, price_per_hour_micros)
            lease = Lease.objects.create(
                renter=renter,
                host=host,
                epoch=_next_epoch(),
                state=State.RESERVING,
                image=spec.image,
                ports=list(spec.ports),
                env=dict(spec.env),
                command=spec.command,
                entrypoint=spec.entrypoint,
                user=spec.user,
                cache_volume=cache_volumes.for_renter(renter.pk, spec.cache_volume),
                volumes=list(spec.volumes),
                warmup=spec.warmup,
                access_protected=spec.access_protected,
                price_per_hour_micros=price_per_hour_micros,
                # Fixed now too: a supplier's later change reaches only new rentals.
                disk_allowance_bytes=sum(gpu.disk_allowance_bytes for gpu in gpus),
                platform_fee_bps=settings.PLATFORM_FEE_BPS,
                stop_at=timezone.now() + spec.stop_after if spec.stop_after else None,
            )
            try:
                note_mounted(lease, timezone.now())
            except VolumeError as exc:
                raise LeaseError(str(exc)) from None
            if tunnels.enabled():
                tunnels.allocate(lease)
            LeaseGpu.objects.bulk_create([LeaseGpu(lease=lease, gpu=gpu) for gpu in gpus])
            indices = ",".join(str(i) for i in sorted(gpu_indices))
            # The docker_run this lease will need, checked now: a rental the agent could never
            # start is refused before it holds GPUs (paid_until is the hub's own timestamp).
            commands.payload(commands.docker_run(lease, paid_until=None))
            _queue_command(lease, commands.reserve(lease, indices))
    except IntegrityError:
        raise LeaseError("that GPU was just rented by someone else") from None
    except (tunnels.TunnelError, billing.OutOfFunds) as exc:
        raise LeaseError(str(exc)) from None
    except commands.InvalidCommand as exc:
        raise LeaseError(f"the host's agent would refuse this rental: {exc.reason}") from None
    return lease


# --- release ------------------------------------------------------------------------------------


def release_lease(
    lease_id: Any, reason: str = Lease.EndReason.RENTER_STOP, now: datetime | None = None
) -> Lease:
    """Stop a lease (renter, admin, expiry, no funds). Idempotent."""
    with transaction.atomic():
        lease = Lease.objects.select_for_update(no_key=True).get(pk=lease_id)
        if lease.state in (State.PENDING, State.RESERVING, State.STARTING, State.RUNNING):
            now = now or timezone.now()
            lease.state = State.STOPPING
            lease.end_reason = reason
            lease.stop_requested_at = now
            lease.save(update_fields=["state", "end_reason", "stop_requested_at"])
            # The bill is final at the stop request: however long the host takes to carry
            # out the release (or however often it fails), the renter pays nothing more.
            billing.settle_lease(lease, now)
            _notify_ended(lease)
            _withdraw_pending(lease, "superseded by release")
            _queue_command(lease, commands.release(lease, reason))
    return lease


def expire_due_leases(now: datetime | None = None, batch: int = 100) -> list[str]:
    """Release leases whose keep-alive limit has passed (end reason ``expired``)."""
    now = now or timezone.now()
    due = list(
        Lease.objects.filter(
            stop_at__lte=now,
            state__in=[State.PENDING, State.RESERVING, State.STARTING, State.RUNNING],
        )
        .order_by("stop_at")
        .values_list("pk", flat=True)[:batch]
    )
    for lease_id in due:
        release_lease(lease_id, Lease.EndReason.EXPIRED)
    return [str(lease_id) for lease_id in due]


def _withdraw_pending(lease: Lease, why: str, *, releases_too: bool = False) -> None:
    """Stop re-sending a lease's unanswered commands: a reserve re-sent after its release
    would claim the GPU again for a lease that is over."""
    pending = Command.objects.filter(
        lease=lease, state__in=[Command.State.QUEUED, Command.State.SENT]
    )
    if not releases_too:
        pending = pending.exclude(kind=Command.Kind.RELEASE)
    pending.update(state=Command.State.FAILED, error=why)


def _free_gpus(lease: Lease) -> None:
    LeaseGpu.objects.filter(lease=lease, active=True).update(active=False)


def _finish(lease: Lease, state: str, now: datetime, reason: str = "", failure: str = "") -> None:
    previous = lease.state
    lease.state = state
    if reason and not lease.end_reason:
        lease.end_reason = reason
    if failure and not lease.failure_reason:
        lease.failure_reason = failure
    lease.ended_at = lease.ended_at or now
    lease.save()
    # Charged up to ended_at in the same transaction, under the same lock.
    billing.settle_lease(lease, now)
    _free_gpus(lease)
    tunnels.close(lease, now)
    if state == State.FAILED and previous != State.FAILED:
        _notify_failed(lease)
    elif state == State.ENDED and previous in _COMMITTED:
        # From stopping the renter heard it at the stop request (release_lease); a lease that
        # ends without one (its host lost or restarted) is told here.
        _notify_ended(lease)


def _fail_and_release(lease: Lease, failure: str) -> None:
    """A lease that never ran: record why, and have the agent let go of whatever it holds.
    The GPUs stay granted until the agent confirms the release."""
    previous = lease.state
    lease.state = State.FAILED
    lease.end_reason = Lease.EndReason.ERROR
    lease.failure_reason = failure
    lease.ended_at = timezone.now()
    lease.save()
    _withdraw_pending(lease, "superseded by release")
    _queue_command(lease, commands.release(lease, "error"))
    if previous != State.FAILED:
        _notify_failed(lease)


# --- notifications (hub/notifications): written in the transition's transaction ------------------

# States a lease bills in (or will once running): leaving them for stopping or ended is the
# rental's end for its renter, who stops paying there, whatever the host's release does later.
_COMMITTED = (State.PENDING, State.RESERVING, State.STARTING, State.RUNNING)
_TIMES = "\u00d7"  # the multiplication sign: "2\u00d7 H100"


def _gpus_words(lease: Lease) -> str:
    """The lease's GPUs by model, as a renter names them: "2\u00d7 NVIDIA H100 80GB HBM3"."""
    names = list(
        LeaseGpu.objects.filter(lease=lease)
        .order_by("gpu__index")
        .values_list("gpu__name", flat=True)
    )
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{count}{_TIMES} {name}" for name, count in counts.items())


def _notify_running(lease: Lease) -> None:
    host = Host.objects.only("name", "hostname", "agent_id").get(pk=lease.host_id)
    emit(
        lease.renter_id,
        "rental.running",
        {
            "lease": str(lease.pk),
            "host": host.label,
            "gpus": _gpus_words(lease),
            "image": lease.image,
        },
    )


def _notify_failed(lease: Lease) -> None:
    emit(
        lease.renter_id,
        "rental.failed",
        {"lease": str(lease.pk), "reason": lease.failure_reason or "the rental could not start"},
    )


def _notify_ended(lease: Lease) -> None:
    """Called once the lease is settled: what the ledger charged it is its final cost."""
    charged = LedgerEntry.objects.filter(lease=lease, kind=LedgerEntry.Kind.CHARGE).aggregate(
        total=Sum("amount_micros")
    )["total"]
    cost = -int(charged or 0)
    emit(
        lease.renter_id,
        "rental.ended",
        {
            "lease": str(lease.pk),
            "reason": (lease.get_end_reason_display() or "ended").lower(),
            "cost": format_micros(cost, cents=True, symbol=""),
            "cost_micros": cost,
        },
    )


# --- agent answers ------------------------------------------------------------------------------


def renter_reason(error: str | None) -> str:
    """Agent errors in words a renter understands, without the host's paths: agents from before
    ``host_paths`` sent Docker's text whole (the command row keeps it for the platform)."""
    text = redact_host_paths(error or "the host reported an unknown error")
    if error and text != error:
        log.warning("host paths left out of a failure reason; the agent said: %s", error)
    lowered = text.lower()
    if "not found" in lowered and "image" in lowered:
        return f"The image could not be found: {text}"
    if "foreign compute process" in lowered or "held by" in lowered or "locked by" in lowered:
        return f"The GPU is in use by another platform on this host: {text}"
    return text


def record_ack(host_id: int, ack: Ack, now: datetime | None = None) -> bool:
    """Apply an agent's answer once; a repeated ack changes nothing. Returns True if applied."""
    now = now or timezone.now()
    lease_id = (
        Command.objects.filter(pk=ack.command_id, host_id=host_id)
        .values_list("lease_id", flat=True)
        .first()
    )
    if lease_id is None:
        return False  # unknown, or another host's command
    with transaction.atomic():
        # Lease before command, the order every other transition locks them in.
        lease = Lease.objects.select_for_update(no_key=True).get(pk=lease_id)
        command = Command.objects.select_for_update(no_key=True).get(pk=ack.command_id)
        if command.state in (Command.State.ACKED, Command.State.FAILED):
            return False
        command.state = Command.State.ACKED
        command.ok = ack.ok
        command.result = ack.result
        command.error = ack.error or ""
        command.acked_at = now
        command.save()
        _advance(lease, command, ack, now)
    _observe_ack(command, lease, now)
    return True


def _observe_ack(command: Command, lease: Lease, now: datetime) -> None:
    """The ack's metrics, once committed: a rolled-back ack must not count."""
    metrics.DISPATCH_SECONDS.labels(command.kind).observe(
        max((now - command.created_at).total_seconds(), 0.0)
    )
    metrics.COMMANDS_FINISHED.labels(command.kind, "ok" if command.ok else "refused").inc()
    if command.kind == Command.Kind.DOCKER_RUN and lease.running_since == now:
        metrics.RENT_TO_RUNNING_SECONDS.observe(max((now - lease.created_at).total_seconds(), 0.0))


# How many warnings a lease keeps, and how long each: the lease page shows them all.
MAX_WARNINGS = 10
MAX_WARNING_CHARS = 500


def _strings(value: Any) -> list[str]:
    """An ack's warnings as the lease keeps them: strings, at most 10, each at most 500."""
    if not isinstance(value, list):
        return []
    # Docker's words can reach a warning too (a release that failed): no host paths in them.
    return [redact_host_paths(item)[:MAX_WARNING_CHARS] for item in value if isinstance(item, str)][
        :MAX_WARNINGS
    ]


def _with_warning(warnings: list[str], text: str) -> list[str]:
    """``warnings`` with ``text`` added once (agents repeat themselves: a container_exited comes
    with every heartbeat until the release), the newest MAX_WARNINGS kept."""
    text = redact_host_paths(text)[:MAX_WARNING_CHARS]  # an agent's words: no host paths
    if not text or text in warnings:
        return warnings
    return [*warnings, text][-MAX_WARNINGS:]


_DIGEST = re.compile(r"(?:[^\s@]{1,200}@)?sha256:[0-9a-f]{64}")


def _image_digest(value: Any) -> str:
    """An ack's ``image_digest`` as the lease keeps it: ``name@sha256:<64 hex>`` or
    ``sha256:<64 hex>``, printable, else empty (an agent's word, so checked)."""
    if not isinstance(value, str) or len(value) > 300 or not value.isprintable():
        return ""
    return value if _DIGEST.fullmatch(value) else ""


def _advance(lease: Lease, command: Command, ack: Ack, now: datetime) -> None:
    kind = command.kind
    if kind == Command.Kind.RESERVE:
        if lease.state != State.RESERVING:
            return  # the lease moved on (e.g. the renter stopped it); its release follows
        if not ack.ok:
            _finish(lease, State.FAILED, now, Lease.EndReason.ERROR, renter_reason(ack.error))
            return
        lease.warnings = list(ack.result.get("warnings", []))
        if ack.result.get("tunnel_public_key") is not None:
            # Known before docker_run, the gateway takes the tunnel's first attempt and the
            # agent can ack running once the URLs work (agents before this send it later).
            warning = tunnels.register_key(lease, ack.result["tunnel_public_key"])
            if warning:
                lease.warnings = [*lease.warnings, warning]
        lease.state = State.STARTING
        lease.save(update_fields=["state", "warnings"])
        _queue_command(lease, commands.docker_run(lease, commands.paid_until(lease)))
    elif kind == Command.Kind.DOCKER_RUN:
        if lease.state != State.STARTING:
            return
        if not ack.ok:
            _fail_and_release(lease, renter_reason(ack.error))
            return
        lease.container_id = str(ack.result.get("container_id", ""))[:128]
        lease.image_digest = _image_digest(ack.result.get("image_digest"))
        lease.host_ports = dict(ack.result.get("ports", {}))
        lease.state = State.RUNNING
        lease.running_since = now
        lease.warnings = [*lease.warnings, *_strings(ack.result.get("warnings"))]
        warning = tunnels.register_key(lease, ack.result.get("tunnel_public_key"))
        if warning and warning not in lease.warnings:
            lease.warnings = [*lease.warnings, warning]
        tunnels.apply_ack_states(lease, ack.result.get("tunnel_states"), now)
        lease.save(
            update_fields=[
                *("container_id", "image_digest", "host_ports", "state", "running_since"),
                "warnings",
            ]
        )
        _notify_running(lease)
    elif kind == Command.Kind.RELEASE:
        if not ack.ok and lease.lease_gpus.filter(active=True).exists():
            # The agent still holds the claim (its container would not go): try again in a
            # while; the GPUs stay granted until a release succeeds.
            log.warning("release of lease %s failed on the host: %s", lease.pk, ack.error)
            _queue_command(
                lease,
                commands.release(lease, lease.end_reason or "error"),
                delay_s=RELEASE_RETRY_S,
            )
            return
        final = State.FAILED if lease.state == State.FAILED else State.ENDED
        _finish(lease, final, now)


# What the renter reads when an agent stopped their container without saying why in words.
_STOP_CAUSE_WORDS = {
    "disk_allowance": "The host stopped this rental: it wrote more than its disk allowance.",
    "disk_floor": (
        "The host stopped this rental: the host's disk ran low and this rental wrote the most."
    ),
}


def record_container_exit(host_id: int, message: ContainerExited) -> None:
    """The lease's container stopped by itself, or its agent stopped it for its disk use
    (``stop_cause``): end the lease (and its billing), saying why on its page."""
    with transaction.atomic():
        lease = (
            Lease.objects.select_for_update(no_key=True)
            .filter(pk=message.lease_id, host_id=host_id)
            .first()
        )
        if lease is None:
            return
        lease.exit_code = message.exit_code
        lease.log_tail = message.log_tail[-16384:]
        fields = ["exit_code", "log_tail"]
        if message.stop_cause and lease.active:
            why = message.stop_reason or _STOP_CAUSE_WORDS.get(message.stop_cause, "")
            lease.warnings = _with_warning(lease.warnings, why)
            fields.append("warnings")
        lease.save(update_fields=fields)
    if lease.state in (State.STARTING, State.RUNNING):
        if message.stop_cause:
            reason = Lease.EndReason.DISK
        elif message.oom_killed:
            reason = Lease.EndReason.OUT_OF_MEMORY
        else:
            reason = Lease.EndReason.EXITED
        release_lease(lease.pk, reason)


def record_notice(host_id: int, message: LeaseNotice) -> bool:
    """Something a lease's renter should read now, from its agent (its disk nearly used up):
    added once to the lease's warnings while it starts or runs. Another host's lease, or one
    that is over, is left alone. True when the warnings changed."""
    with transaction.atomic():
        lease = (
            Lease.objects.select_for_update(no_key=True)
            .filter(pk=message.lease_id, host_id=host_id, state__in=[State.STARTING, State.RUNNING])
            .first()
        )
        if lease is None:
            return False
        warnings = _with_warning(lease.warnings, message.text)
        if warnings == lease.warnings:
            return False
        lease.warnings = warnings
        lease.save(update_fields=["warnings"])
    return True


# --- reconciliation and host loss ---------------------------------------------------------------


def hosts_with_leases_to_reconcile(host_ids: list[int]) -> set[int]:
    """Which of these hosts ``reconcile_claims`` has work for on a register (one statement):
    a lease that is live on the host, or one whose grace clock runs."""
    live = Q(state__in=[State.RESERVING, State.STARTING, State.RUNNING, State.STOPPING]) | Q(
        state=State.FAILED, lease_gpus__active=True
    )
    return set(
        Lease.objects.filter(live | Q(host_lost_since__isnull=False), host_id__in=host_ids)
        .values_list("host_id", flat=True)
        .distinct()
    )


def reconcile_claims(host: Host, claims: tuple[ClaimState, ...], now: datetime) -> tuple[str, ...]:
    """On register: which of the agent's claims the hub still wants; end leases the agent lost."""
    reported = {claim.lease_id for claim in claims}
    desired: list[str] = []
    # Most hosts of a reconnect storm hold no lease: one look, and nothing else to do.
    if not hosts_with_leases_to_reconcile([host.pk]):
        return ()
    live = Q(state__in=[State.RESERVING, State.STARTING, State.RUNNING, State.STOPPING]) | Q(
        state=State.FAILED, lease_gpus__active=True
    )
    # The host is back: the grace clock stops for every lease on it; the ones the agent
    # really lost are ended below.
    note_host_back(host.pk, now)
    live_ids = Lease.objects.filter(live, host=host).values("pk")
    for lease in (
        Lease.objects.select_for_update(no_key=True).filter(pk__in=live_ids).order_by("pk")
    ):
        lease_id = str(lease.id)
        if lease_id in reported:
            if lease.state in (State.RESERVING, State.STARTING, State.RUNNING):
                desired.append(lease_id)
            continue
        if lease.state == State.RESERVING:
            # Its reserve may not have arrived yet, or may be executing right now on the agent
            # (a command from before the reconnect): keep wanting it.
            desired.append(lease_id)
            continue
        if lease.state in (State.STARTING, State.RUNNING):
            _withdraw_pending(lease, "the host no longer runs this lease")
            _finish(
                lease,
                State.ENDED,
                now,
                Lease.EndReason.HOST_LOST,
                "The host restarted and no longer runs this rental.",
            )
        else:
            # Stopping or failed, and the agent holds nothing: the release is as good as done.
            _withdraw_pending(lease, "the host holds nothing to release", releases_too=True)
            _finish(lease, State.FAILED if lease.state == State.FAILED else State.ENDED, now)
    return tuple(desired)


def note_host_lost(host_id: int, now: datetime) -> None:
    # Stopping too: until the agent confirms the release the lease is billed, and a host that
    # never returns must end it (past the grace) rather than bill it forever.
    Lease.objects.filter(
        host_id=host_id,
        state__in=[State.RESERVING, State.STARTING, State.RUNNING, State.STOPPING],
        host_lost_since__isnull=True,
    ).update(host_lost_since=now)


def note_host_back(host_id: int, now: datetime | None = None) -> None:
    """The host returned within the grace: its leases go on, and the time it was away is
    recorded so that metering never charges for it."""
    now = now or timezone.now()
    away = Lease.objects.filter(host_id=host_id, host_lost_since__isnull=False).only(
        "pk", "host_lost_since", "running_since", "stop_requested_at", "ended_at"
    )
    for lease in away:
        # Compare-and-set on host_lost_since: a racing call (register and a heartbeat flush)
        # adds the outage once. Only its running part is ever subtracted from running time.
        Lease.objects.filter(pk=lease.pk, host_lost_since=lease.host_lost_since).update(
            offline_duration=F("offline_duration")
            + metering.running_overlap(lease, lease.host_lost_since, now),
            host_lost_since=None,
        )


_LOSABLE = (State.RESERVING, State.STARTING, State.RUNNING, State.STOPPING)


def end_leases_of_lost_hosts(now: datetime | None = None) -> list[str]:
    """Past the grace period, a lease on a host that has not come back ends with host_lost."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.LEASE_HOST_GRACE_S)
    ended = []
    for lease_id in Lease.objects.filter(
        host_lost_since__lt=cutoff, state__in=_LOSABLE
    ).values_list("pk", flat=True)[:500]:
        with transaction.atomic():
            lease = Lease.objects.select_for_update(no_key=True).get(pk=lease_id)
            if lease.host_lost_since is None or lease.host_lost_since >= cutoff:
                continue
            if lease.state not in _LOSABLE:
                continue
            _finish(lease, State.ENDED, now, Lease.EndReason.HOST_LOST, "The host went away.")
            _withdraw_pending(lease, "host lost", releases_too=True)
            # If the agent is still (or again) connected, it lets go now; if it returns later,
            # register tells it the hub no longer wants the claim.
            _queue_command(lease, commands.release(lease, Lease.EndReason.HOST_LOST))
            ended.append(str(lease_id))
    return ended


# --- deadlines ----------------------------------------------------------------------------------


def expire_command(command_id: Any) -> None:
    """A command's deadline passed without an ack: give up on it and on what it was for."""
    lease_id = Command.objects.filter(pk=command_id).values_list("lease_id", flat=True).first()
    if lease_id is None:
        return
    with transaction.atomic():
        lease = Lease.objects.select_for_update(no_key=True).get(pk=lease_id)
        command = Command.objects.select_for_update(no_key=True).get(pk=command_id)
        if command.state not in (Command.State.QUEUED, Command.State.SENT):
            return
        command.state = Command.State.FAILED
        command.error = "no answer from the host before the deadline"
        command.save(update_fields=["state", "error"])
        metrics.COMMANDS_FINISHED.labels(command.kind, "deadline").inc()
        if command.kind == Command.Kind.RELEASE:
            if lease.lease_gpus.filter(active=True).exists():
                # The agent may still hold the GPUs: ask again rather than hand them on. An
                # offline host's leases are settled by the host-lost path instead.
                _queue_command(lease, commands.release(lease, lease.end_reason or "error"))
        elif lease.state in (State.RESERVING, State.STARTING):
            _fail_and_release(lease, "The host did not answer in time.")
