"""Moving a rollout on, every ROLLOUT_TICK_S (the beat's ``rollouts.advance``).

Each tick, for the rollout under way:

1. What happened: a host told to upgrade that now registers at the version is ``upgraded``
   (then watched ROLLOUT_OBSERVE_S: going offline, or coming back on a new connection
   ROLLOUT_CRASHLOOP_RESTARTS times, in that time fails it); one that has not
   within ROLLOUT_HOST_TIMEOUT_S has ``failed``; one rolling back that registers at its old
   version is ``rolled_back``.
2. The verdict on the wave under way (unless an admin accepted it by resuming): if the share
   of its hosts that failed exceeds the share of the other hosts that went offline meanwhile
   by more than ROLLOUT_MAX_FAILURE_PERCENT points, the rollout pauses, says why, and the
   wave's hosts that run the version are told to roll back.
3. A healthy wave that has settled (nobody still upgrading or watched) starts the pause; after
   it the next wave starts, or after the last one the rollout is done.
4. Hosts of a started wave still pending are told to upgrade once online, and not in a
   rental's first ROLLOUT_FRESH_RENTAL_S unless the rollout is forced. Hosts offline at the end
   stay pending, and join when they connect while this is the latest rollout; the fleet page
   lists them as left behind.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone

from hub.leases.models import Lease
from hub.rollouts import services
from hub.rollouts.models import Rollout, RolloutHost
from hub.suppliers.models import Host, HostTransition

log = logging.getLogger(__name__)

State = RolloutHost.State
FAILED_STATES = (State.FAILED, State.ROLLING_BACK, State.ROLLED_BACK)
TRIED_STATES = (State.SENT, State.UPGRADED, *FAILED_STATES)


def advance(now: datetime | None = None) -> None:
    now = now or timezone.now()
    # The latest rollout only: an older one's latecomers are not told an older version.
    latest = Rollout.objects.order_by("-created_at").values_list("pk", flat=True).first()
    if latest is None:
        return
    with transaction.atomic():
        # One tick at a time (a slow one and the next beat), and never under an admin's
        # pause or resume: whoever holds the row, this tick skips.
        rollout = Rollout.objects.select_for_update(skip_locked=True).filter(pk=latest).first()
        if rollout is None:
            return
        _observe(rollout, now)
        if rollout.state == Rollout.State.RUNNING:
            _run(rollout, now)
        elif rollout.state == Rollout.State.DONE:
            _send_pending(rollout, rollout.waves, now)  # latecomers join
        # In every state, aborted too: a host told to roll back is told until it has.
        _send_rollbacks(rollout, now)


def _run(rollout: Rollout, now: datetime) -> None:
    if rollout.wave == 0:
        _start_wave(rollout, 1, now)
    elif rollout.wave != rollout.accepted_wave and (reason := _verdict(rollout, now)):
        _stop_wave(rollout, reason)
        return
    elif rollout.next_wave_at is None and _settled(rollout, now):
        rollout.next_wave_at = now + timedelta(seconds=rollout.pause_s)
        rollout.save(update_fields=["next_wave_at"])
    if rollout.next_wave_at is not None and now >= rollout.next_wave_at:
        if rollout.wave >= rollout.waves:
            rollout.state, rollout.finished_at = Rollout.State.DONE, now
            rollout.save(update_fields=["state", "finished_at"])
            log.info("rollout of %s: every wave went out", rollout.version)
        else:
            _start_wave(rollout, rollout.wave + 1, now)
    _send_pending(rollout, rollout.wave, now)


def _start_wave(rollout: Rollout, wave: int, now: datetime) -> None:
    rollout.wave, rollout.wave_started_at, rollout.next_wave_at = wave, now, None
    rollout.save(update_fields=["wave", "wave_started_at", "next_wave_at"])
    log.info("rollout of %s: wave %d of %d starts", rollout.version, wave, rollout.waves)


TOLD = "told to upgrade"


def _observe(rollout: Rollout, now: datetime) -> None:
    observe_from = now - timedelta(seconds=settings.ROLLOUT_OBSERVE_S)
    rows = list(
        RolloutHost.objects.select_related("host").filter(
            Q(state__in=(State.SENT, State.ROLLING_BACK))
            | Q(state=State.UPGRADED, upgraded_at__gt=observe_from),
            rollout=rollout,
        )
    )
    timeout = timedelta(seconds=settings.ROLLOUT_HOST_TIMEOUT_S)
    watched = {r.pk: r.upgraded_at for r in rows if r.state == State.UPGRADED}
    went_offline = dict(
        HostTransition.objects.filter(
            host_id__in=[r.host_id for r in rows if r.pk in watched],
            to_status=Host.Status.OFFLINE,
            at__gte=min(watched.values(), default=now),
        )
        .values("host_id")
        .annotate(last=Max("at"))
        .values_list("host_id", "last")
    )
    for row in rows:
        if not _observe_row(rollout, row, now, timeout, went_offline.get(row.host_id)):
            continue
        row.save(
            update_fields=[
                *("state", "sent_at", "upgraded_at", "detail", "channel", "restarts"),
                "updated_at",
            ]
        )


def _observe_row(
    rollout: Rollout,
    row: RolloutHost,
    now: datetime,
    timeout: timedelta,
    offline_at: datetime | None,
) -> bool:
    """What became of one host; True if its row changed."""
    version, channel = row.host.agent_version, row.host.channel_name
    if row.state == State.SENT and version == rollout.version:
        if rollout.self_paused and row.wave == rollout.wave:
            # It got there after its wave was stopped: back it goes, like the others.
            row.state, row.sent_at = State.ROLLING_BACK, None
            row.detail = f"reached {version} after the wave was stopped: rolling back"
        else:
            row.state, row.upgraded_at = State.UPGRADED, now
            row.detail, row.channel = f"runs {version}", channel
    elif (
        row.state == State.SENT
        and row.detail == TOLD
        and version == row.from_version
        and channel
        and channel != row.channel
    ):
        # It reconnected before saying anything: the frame went to a dead socket. Again.
        row.state, row.detail = State.PENDING, "its connection changed before it answered"
    elif row.state == State.SENT and row.sent_at is not None and now - row.sent_at > timeout:
        row.state = State.FAILED
        row.detail = (
            f"did not come back at {rollout.version} within "
            f"{settings.ROLLOUT_HOST_TIMEOUT_S} s (it runs {version or 'nothing known'})"
        )
    elif row.state == State.UPGRADED:
        if offline_at is not None and offline_at >= row.upgraded_at:
            row.state = State.FAILED
            seconds = int((offline_at - row.upgraded_at).total_seconds())
            row.detail = f"lost its heartbeats {seconds} s after it came back at {version}"
        elif channel and channel != row.channel:
            row.channel, row.restarts = channel, row.restarts + 1
            if row.restarts >= settings.ROLLOUT_CRASHLOOP_RESTARTS:
                row.state = State.FAILED
                seconds = int((now - row.upgraded_at).total_seconds())
                row.detail = (
                    f"restarted {row.restarts} times in {seconds} s at {version} (a crash loop)"
                )
        else:
            return False
    elif row.state == State.ROLLING_BACK and version == row.from_version:
        row.state = State.ROLLED_BACK
        row.detail = f"back at {version}"
    elif row.state == State.ROLLING_BACK and row.sent_at and now - row.sent_at > timeout:
        row.sent_at = None  # told, and nothing since: tell it again
    else:
        return False
    return True


def _wave(rollout: Rollout) -> QuerySet[RolloutHost]:
    return RolloutHost.objects.filter(rollout=rollout, wave=rollout.wave)


def _verdict(rollout: Rollout, now: datetime) -> str | None:
    """Why the wave under way must stop, or None. Counted in SQL: a wave may be thousands."""
    counts = _wave(rollout).aggregate(
        tried=Count("pk", filter=Q(state__in=TRIED_STATES)),
        failed=Count("pk", filter=Q(state__in=FAILED_STATES)),
    )
    tried, failed = counts["tried"], counts["failed"]
    if not failed:
        return None
    rate = failed / tried
    others = _others_offline_rate(rollout, rollout.wave_started_at or now)
    if (rate - others) * 100 <= settings.ROLLOUT_MAX_FAILURE_PERCENT:
        return None
    first = _wave(rollout).filter(state__in=FAILED_STATES).select_related("host").order_by("pk")
    examples = "; ".join(f"{r.host.label}: {r.detail}" for r in first[:3])
    return (
        f"wave {rollout.wave}: {failed} of {tried} hosts failed ({examples}), "
        f"against {others:.0%} of the other hosts offline meanwhile"
    )


def _others_offline_rate(rollout: Rollout, since: datetime) -> float:
    tried = RolloutHost.objects.filter(rollout=rollout, state__in=TRIED_STATES).values("host_id")
    others = Host.objects.exclude(pk__in=tried)
    total = others.count()
    if not total:
        return 0.0
    offline = (
        HostTransition.objects.filter(
            at__gte=since, to_status=Host.Status.OFFLINE, host_id__in=others.values("pk")
        )
        .values("host_id")
        .distinct()
        .count()
    )
    return offline / total


def _stop_wave(rollout: Rollout, reason: str) -> None:
    rollout.state, rollout.reason, rollout.self_paused = Rollout.State.PAUSED, reason, True
    rollout.save(update_fields=["state", "reason", "self_paused"])
    log.warning("rollout of %s paused: %s", rollout.version, reason)
    # The hosts that run the version (never switched, or nothing known to go back to: stay).
    _wave(rollout).filter(
        state__in=(State.SENT, State.UPGRADED, State.FAILED),
        host__agent_version=rollout.version,
    ).exclude(from_version="").update(
        state=State.ROLLING_BACK, sent_at=None, updated_at=timezone.now()
    )
    _send_rollbacks(rollout, timezone.now())


def _send_rollbacks(rollout: Rollout, now: datetime) -> None:
    """Each host rolling back is told once its socket is open (at once if it is now): also
    when the sweep marked it offline, as a release that stops heartbeats gets it marked."""
    rows = RolloutHost.objects.select_related("host", "rollout").filter(
        rollout=rollout, state=State.ROLLING_BACK, sent_at__isnull=True
    )
    for row in rows:
        if row.host.channel_name:
            row.sent_at = now
            row.save(update_fields=["sent_at", "updated_at"])
            services.send_rollback(row, row.host.channel_name)


def _settled(rollout: Rollout, now: datetime) -> bool:
    """Nobody in the wave still upgrading or watched."""
    observe_from = now - timedelta(seconds=settings.ROLLOUT_OBSERVE_S)
    return (
        not _wave(rollout)
        .filter(Q(state=State.SENT) | Q(state=State.UPGRADED, upgraded_at__gt=observe_from))
        .exists()
    )


def _send_pending(rollout: Rollout, upto_wave: int, now: datetime) -> None:
    """Tell the started waves' online, idle hosts: ROLLOUT_SEND_PER_TICK at most a tick, so
    a wave of thousands does not download the wheel from the hub all in one second."""
    rows = list(
        RolloutHost.objects.select_related("host", "rollout")
        .filter(
            rollout=rollout,
            wave__lte=upto_wave,
            state=State.PENDING,
            host__status=Host.Status.ONLINE,
        )
        .exclude(host__channel_name="")
        .order_by("wave", "pk")[: settings.ROLLOUT_SEND_PER_TICK]
    )
    if not rows:
        return
    busy: set[int] = set()
    if not rollout.force:
        fresh = now - timedelta(seconds=settings.ROLLOUT_FRESH_RENTAL_S)
        busy = set(
            Lease.objects.filter(
                host_id__in=[r.host_id for r in rows],
                state__in=Lease.ACTIVE_STATES,
                created_at__gt=fresh,
            ).values_list("host_id", flat=True)
        )
    for row in rows:
        if row.host_id in busy:
            if row.detail != WAITING:
                row.detail = WAITING
                row.save(update_fields=["detail", "updated_at"])
            continue
        row.channel = row.host.channel_name
        if row.host.agent_version == rollout.version:
            row.state, row.upgraded_at = State.UPGRADED, now
            row.detail = f"runs {rollout.version} already"
        else:
            row.state, row.sent_at, row.detail = State.SENT, now, TOLD
            row.from_version = row.host.agent_version
            services.send_upgrade(row, row.host.channel_name)
        row.save(
            update_fields=[
                *("state", "sent_at", "upgraded_at", "from_version", "detail", "channel"),
                "updated_at",
            ]
        )


WAITING = "waiting: a rental started on it minutes ago"
