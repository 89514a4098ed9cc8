"""Where the latest rollout stands, for the fleet page."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from django.db.models import Count

from hub.rollouts.models import Rollout, RolloutHost

TABLE_ROWS = 20
# The hosts an admin needs to look at, in this order.
NOTABLE = (
    RolloutHost.State.FAILED,
    RolloutHost.State.ROLLING_BACK,
    RolloutHost.State.ROLLED_BACK,
    RolloutHost.State.LEFT_BEHIND,
    RolloutHost.State.PENDING,
)


@dataclass(frozen=True)
class RolloutView:
    rollout: Rollout
    counts: dict[str, int]  # hosts per state, every state present
    total: int
    upgraded: int
    waves: list[tuple[int, int, int]]  # (wave, hosts, upgraded)
    notable: list[RolloutHost]  # failed, rolled back, left behind, pending: TABLE_ROWS at most
    left_behind: int  # pending once every wave went out, and those that cannot take part


def latest() -> RolloutView | None:
    rollout = Rollout.objects.first()
    if rollout is None:
        return None
    rows = RolloutHost.objects.filter(rollout=rollout)
    counts = Counter(dict.fromkeys(RolloutHost.State.values, 0))
    per_wave: dict[int, list[int]] = {}
    # One grouped query gives both tables: (wave, state) -> hosts.
    grouped = rows.order_by().values_list("wave", "state").annotate(n=Count("pk"))
    for wave, state, n in grouped:
        counts[state] += n
        entry = per_wave.setdefault(wave, [0, 0])
        entry[0] += n
        entry[1] += n if state == RolloutHost.State.UPGRADED else 0
    notable = sorted(
        rows.filter(state__in=NOTABLE).select_related("host")[: TABLE_ROWS * 5],
        key=lambda r: (NOTABLE.index(r.state), r.wave, r.host_id),
    )[:TABLE_ROWS]
    finished = rollout.state in (Rollout.State.DONE, Rollout.State.ABORTED)
    left = counts[RolloutHost.State.LEFT_BEHIND] + (
        counts[RolloutHost.State.PENDING] if finished else 0
    )
    return RolloutView(
        rollout=rollout,
        counts=dict(counts),
        total=sum(counts.values()),
        upgraded=counts[RolloutHost.State.UPGRADED],
        waves=[(w, n, up) for w, (n, up) in sorted(per_wave.items())],
        notable=notable,
        left_behind=left,
    )
