"""The offline sweep: hosts whose heartbeat deadline passed go offline, with the lease side of
it (hub/leases/host_status.py), and a socket that is still open hears so."""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from hub.agents import storm
from hub.leases import host_status
from hub.lib import channel_send
from hub.suppliers import liveness
from hub.suppliers.models import Host

SWEEP_BATCH = 500

log = logging.getLogger(__name__)


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
    if not candidates:
        storm.calm()
        return []
    # A web process restarted and its agents are still coming back: their deadlines passed
    # while they had no socket to heartbeat on. Not a failure (storm.py says how it is told
    # apart, and how long a hold may last).
    reason = storm.holding(now_ts)
    if reason is not None:
        log.info(
            "offline sweep holds %d overdue hosts: reconnect storm (%s)", len(candidates), reason
        )
        return []
    went_offline = []
    for host_id in sorted(candidates):
        deadline = liveness.deadline_of(host_id)
        if deadline is not None and deadline > now_ts:
            continue  # Redis has a fresher heartbeat than Postgres
        reason = f"no heartbeat for {settings.HOST_OFFLINE_AFTER_S} s"
        if host_status.host_lost(host_id, reason, now):
            went_offline.append(host_id)
            _tell_socket_marked_offline(host_id)
        liveness.forget_if_overdue(host_id, now_ts)
    return went_offline


def _tell_socket_marked_offline(host_id: int) -> None:
    """If the host's socket is still open (a stalled agent, a slow network), its next heartbeat
    brings it back at once instead of at the next telemetry flush (heartbeats.py)."""
    channel = Host.objects.filter(pk=host_id).values_list("channel_name", flat=True).first()
    if channel:
        channel_send.send(channel, {"type": "agent.marked_offline"})
