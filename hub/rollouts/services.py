"""Starting, pausing, resuming and aborting a rollout, and what the agents say of it.

One rollout is under way (running or paused) at a time: its version is the release the hub
serves at /agent/release.json when it starts, which is what every agent of it fetches. The
waves are fixed at the start: the named hosts first (if any), then the other hosts older than
the version in a stable random order, cut at the cumulative percentages. progress.py moves it
on; docs/operators.md says how to use it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from hub.installer import releases
from hub.lib import channel_send
from hub.lib.versions import is_older
from hub.rollouts.models import Rollout, RolloutHost
from hub.suppliers.models import Host
from supplier_agent.protocol import Rollback, Upgrade, UpgradeStatus, encode

# The first agent version that takes `upgrade` and `rollback` from the hub.
ROLLOUT_SINCE = "0.3.0"
MAX_WAVES = 10
# pg_advisory_xact_lock key: two admins starting rollouts at once get one.
_CREATE_LOCK = 0x524F4C4C  # "ROLL"

State = RolloutHost.State


class RolloutError(ValueError):
    """Said to the admin as it is."""


def parse_percents(text: str) -> list[int]:
    """ "1, 10, 50, 100" -> [1, 10, 50, 100]: rising shares of the fleet, 1 to 100."""
    try:
        values = [int(part) for part in text.replace(" ", "").split(",") if part]
    except ValueError:
        raise RolloutError(
            f"waves: {text!r} is not a list of percentages like 1,10,50,100"
        ) from None
    if not values:
        raise RolloutError("waves: give at least one percentage, e.g. 100")
    if len(values) > MAX_WAVES:
        raise RolloutError(f"waves: at most {MAX_WAVES}")
    if any(not 1 <= v <= 100 for v in values) or values != sorted(set(values)):
        raise RolloutError("waves: percentages from 1 to 100, each larger than the one before")
    return values


def find_hosts(text: str) -> list[Host]:
    """Hosts named by id or short id ("3fa9c1"), comma- or space-separated."""
    hosts: list[Host] = []
    for word in text.replace(",", " ").split():
        numeric = word.isascii() and word.isdecimal() and len(word) <= 18
        query = Host.objects.filter(pk=int(word)) if numeric else Host.objects.none()
        found = list(query) or [
            h for h in Host.objects.filter(agent_id__startswith=word.lower()[:8]) if word
        ]
        if len(found) != 1:
            raise RolloutError(f"no single host is {word!r} (give its id or short id)")
        hosts.append(found[0])
    return hosts


def _order_key(rollout_id: Any, agent_id: Any) -> str:
    # Stable for one rollout, different for the next: not always the same hosts first.
    return hashlib.sha256(f"{rollout_id}:{agent_id}".encode()).hexdigest()


def _wave_sizes(count: int, percents: list[int]) -> list[int]:
    sizes, done = [], 0
    for percent in percents:
        # At least one more host per wave while there are hosts: 1 % of 20 is one host, not 0.
        upto = min(count, max(math.ceil(count * percent / 100), done + 1))
        sizes.append(upto - done)
        done = upto
    return sizes


def create(
    percents: list[int],
    *,
    named: Iterable[Host] = (),
    pause_s: int = 600,
    force: bool = False,
    by: Any = None,
) -> Rollout:
    try:
        version = releases.served_version()
    except releases.ReleaseError as exc:
        raise RolloutError(f"the hub serves no agent release: {exc}") from None
    named = list(named)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_CREATE_LOCK])
        active = Rollout.objects.filter(state__in=Rollout.ACTIVE_STATES).first()
        if active is not None:
            raise RolloutError(
                f"the rollout of {active.version} is {active.state}: resume it to its end or "
                "abort it first"
            )
        rollout = Rollout.objects.create(
            version=version,
            percents=percents,
            named_first=bool(named),
            pause_s=pause_s,
            force=force,
            created_by=by,
        )
        hosts = [h for h in Host.objects.all() if is_older(h.agent_version or "0", version)]
        if not hosts:
            raise RolloutError(f"every host runs {version} or newer: nothing to roll out")
        # Agents too old to take the command are listed (wave 0), not counted in a wave.
        rows = [
            _left_behind(rollout, h)
            for h in hosts
            if is_older(h.agent_version or "0", ROLLOUT_SINCE)
        ]
        hosts = [h for h in hosts if not is_older(h.agent_version or "0", ROLLOUT_SINCE)]
        named_ids = {h.pk for h in named}
        first = [h for h in hosts if h.pk in named_ids]
        rest = sorted(
            (h for h in hosts if h.pk not in named_ids),
            key=lambda h: _order_key(rollout.pk, h.agent_id),
        )
        rows += [_row(rollout, h, 1) for h in first]
        if not first and rollout.named_first:
            # The named hosts run it already (or cannot take part): no wave of their own.
            rollout.named_first = False
            rollout.save(update_fields=["named_first"])
        offset, start = 0, 2 if first else 1
        for wave, size in enumerate(_wave_sizes(len(rest), percents), start=start):
            rows += [_row(rollout, h, wave) for h in rest[offset : offset + size]]
            offset += size
        RolloutHost.objects.bulk_create(rows)
    return rollout


def _row(rollout: Rollout, host: Host, wave: int) -> RolloutHost:
    return RolloutHost(rollout=rollout, host=host, wave=wave, from_version=host.agent_version)


def _left_behind(rollout: Rollout, host: Host) -> RolloutHost:
    row = _row(rollout, host, 0)
    row.state = State.LEFT_BEHIND
    row.detail = (
        f"its agent ({host.agent_version or 'unknown'}) predates upgrades from the hub: "
        "run `sudo cloudgpu-agent upgrade` on the host once"
    )
    return row


def _transition(rollout_id: Any, allowed: tuple[str, ...], **changes: Any) -> Rollout:
    with transaction.atomic():
        rollout = Rollout.objects.select_for_update().filter(pk=rollout_id).first()
        if rollout is None:
            raise RolloutError("no such rollout")
        if rollout.state not in allowed:
            raise RolloutError(f"the rollout is {rollout.state}")
        for name, value in changes.items():
            setattr(rollout, name, value(rollout) if callable(value) else value)
        rollout.save()
    return rollout


def pause(rollout_id: Any, reason: str) -> Rollout:
    return _transition(
        rollout_id,
        (Rollout.State.RUNNING,),
        state=Rollout.State.PAUSED,
        reason=reason,
        self_paused=False,
    )


def resume(rollout_id: Any) -> Rollout:
    """Go on. After the verdict stopped it, that wave's failures are accepted, not judged
    again; after an admin's pause, the wave is judged as before."""
    return _transition(
        rollout_id,
        (Rollout.State.PAUSED,),
        state=Rollout.State.RUNNING,
        reason="",
        accepted_wave=lambda r: r.wave if r.self_paused else r.accepted_wave,
        self_paused=False,
    )


def abort(rollout_id: Any, reason: str = "aborted by an admin") -> Rollout:
    """Nothing more is sent; hosts already upgraded keep the version."""
    return _transition(
        rollout_id,
        Rollout.ACTIVE_STATES,
        state=Rollout.State.ABORTED,
        reason=reason,
        finished_at=lambda r: timezone.now(),
    )


def send_upgrade(row: RolloutHost, channel: str) -> None:
    frame = encode(Upgrade(rollout_id=str(row.rollout_id), version=row.rollout.version))
    transaction.on_commit(lambda: _send(channel, frame), robust=True)


def send_rollback(row: RolloutHost, channel: str) -> None:
    frame = encode(Rollback(rollout_id=str(row.rollout_id), version=row.from_version))
    transaction.on_commit(lambda: _send(channel, frame), robust=True)


def _send(channel: str, frame: str) -> None:
    channel_send.send(channel, {"type": "agent.command", "frame": frame})


def record_status(host_id: int, message: UpgradeStatus) -> None:
    """An agent's word on an upgrade or rollback. The version it registers with decides in the
    end (progress.py); this gives the reasons, and ends waits that will not end otherwise."""
    with transaction.atomic():
        row = (
            RolloutHost.objects.select_for_update()
            .filter(rollout_id=message.rollout_id, host_id=host_id)
            .first()
        )
        if row is None:
            return
        detail = message.detail or message.state
        if message.state == "failed" and row.state == State.SENT:
            row.state = State.FAILED
        elif message.state == "refused" and row.state == State.SENT:
            row.state = State.LEFT_BEHIND
        elif message.state == "rolled_back" and row.state == State.ROLLING_BACK:
            row.state = State.ROLLED_BACK
        elif message.state in ("failed", "refused") and row.state == State.ROLLING_BACK:
            # Settled: left on the release, for its supplier (and the admin) to look at.
            row.state, detail = State.FAILED, f"rollback failed: {detail}"
        row.detail = detail[:2000]
        row.save(update_fields=["state", "detail", "updated_at"])
