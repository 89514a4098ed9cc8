"""Whether the fleet is reconnecting (a reconnect storm), so that the offline sweep holds.

When a web process stops (a deploy, a crash), every agent on it loses its socket at once and
comes back through registration within a minute or two (the agent's backoff is capped at 60
s). Meanwhile their heartbeat deadlines pass: a sweep that took each overdue host for a failure
would mark thousands offline, end nothing, and bring them back seconds later, each with two
transition rows and their leases' grace clocks started and stopped. So the sweep holds while

- a web process started less than HOST_OFFLINE_AFTER_S ago (its agents may not have had one
  full deadline to come back), or
- the hosts that are overdue plus those that re-registered within the last
  HOST_OFFLINE_AFTER_S are at least SWEEP_STORM_PERCENT % of the fleet (and at least
  SWEEP_STORM_MIN_HOSTS): hosts failing one by one do not look like that; a hub-side outage
  does (the pattern of Kubernetes' node controller, which stops evicting when most nodes go
  unready together, since that is more likely its own partition than theirs).

A real failure must still be seen: a hold lasts at most SWEEP_HOLD_MAX_S from when it began,
after which overdue hosts go offline as usual, and a new hold can begin only after a sweep that
saw no storm (so a crash-looping web process or a fleet-wide network loss is detected, at most
SWEEP_HOLD_MAX_S late). Everything here is a few Redis calls per sweep and one INCR per
re-registration, pipelined with the registration's own liveness ZADD.
"""

from __future__ import annotations

import logging
import math
import time

from django.conf import settings
from redis.exceptions import RedisError

from hub.lib import redis_keys, shared_redis
from hub.suppliers import liveness

log = logging.getLogger(__name__)

# Re-registrations are counted in buckets of this many seconds (each key expires on its own).
BUCKET_S = 5


def web_started_key() -> str:
    return redis_keys.key("web-started-at")


def hold_since_key() -> str:
    return redis_keys.key("storm-hold-since")


def _bucket_key(bucket: int) -> str:
    return redis_keys.key("reregistrations", str(bucket))


def note_web_started(now: float | None = None) -> None:
    """A web process starts serving: the sweep gives its agents one full deadline to return.
    Best effort: a web process starts even when Redis does not answer (the share rule and the
    hold's bound still apply)."""
    now = time.time() if now is None else now
    try:
        liveness.sync_client().set(web_started_key(), repr(now))
    except RedisError as exc:
        log.warning("could not note this web process's start for the offline sweep: %s", exc)


def count_reregistration(pipe: shared_redis.SyncPipeline, now: float) -> None:
    """Queue the count of one re-registration (a host seen before) on the caller's pipeline."""
    key = _bucket_key(int(now // BUCKET_S))
    pipe.incr(key)
    pipe.expire(key, settings.HOST_OFFLINE_AFTER_S + 2 * BUCKET_S)


def _recent_reregistrations(client: shared_redis.SyncRedis, now: float) -> int:
    newest = int(now // BUCKET_S)
    buckets = math.ceil(settings.HOST_OFFLINE_AFTER_S / BUCKET_S)
    values = client.mget([_bucket_key(newest - n) for n in range(buckets + 1)])
    return sum(int(v) for v in values if v is not None)


def storm_reason(now: float) -> str | None:
    """Why the fleet looks like it is reconnecting now, or None (no Redis call writes)."""
    client = liveness.sync_client()
    started = client.get(web_started_key())
    if started is not None and now - float(started) < settings.HOST_OFFLINE_AFTER_S:
        return f"a web process started {now - float(started):.0f} s ago"
    key = liveness.liveness_key()
    with client.pipeline(transaction=False) as pipe:
        pipe.zcard(key)
        pipe.zcount(key, "-inf", now)
        fleet, overdue = pipe.execute()
    returning = _recent_reregistrations(client, now)
    threshold = max(settings.SWEEP_STORM_MIN_HOSTS, settings.SWEEP_STORM_PERCENT * fleet / 100)
    if overdue + returning >= threshold:
        return (
            f"{overdue} hosts overdue and {returning} re-registered in the last "
            f"{settings.HOST_OFFLINE_AFTER_S} s, of {fleet}"
        )
    return None


def calm() -> None:
    """Nothing is overdue: a later storm's hold starts afresh."""
    liveness.sync_client().delete(hold_since_key())


def holding(now: float) -> str | None:
    """Whether this sweep holds (the reason), within the hold's bound; records the hold."""
    client = liveness.sync_client()
    reason = storm_reason(now)
    if reason is None:
        client.delete(hold_since_key())
        return None
    client.set(hold_since_key(), repr(now), nx=True)
    since = client.get(hold_since_key())
    held_for = now - float(since) if since is not None else 0.0
    if held_for > settings.SWEEP_HOLD_MAX_S:
        log.warning(
            "offline sweep: the reconnect storm has lasted %.0f s (%s); marking overdue hosts "
            "offline again (SWEEP_HOLD_MAX_S %s)",
            held_for,
            reason,
            settings.SWEEP_HOLD_MAX_S,
        )
        return None
    return reason
