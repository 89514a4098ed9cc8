"""Rollouts on the real database and channel layer: waves, the verdict, rollbacks, latecomers.
The agents' side is tests/agent/test_self_upgrade.py; the two together, with real agents,
tests/e2e/test_rollout.py."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import override_settings
from django.utils import timezone

from hub.leases.models import Lease
from hub.rollouts import progress, services
from hub.rollouts.models import Rollout, RolloutHost
from hub.suppliers.models import Host, HostTransition
from supplier_agent.protocol import UpgradeStatus
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

TARGET = "0.4.0"
OLD = "0.3.0"
State = RolloutHost.State


def _hosts(n: int, version: str = OLD, online: bool = True) -> list[Host]:
    layer = get_channel_layer()
    hosts = []
    for _ in range(n):
        channel = async_to_sync(layer.new_channel)() if online else ""
        host = f.register_host(channel_name=channel)
        Host.objects.filter(pk=host.pk).update(
            agent_version=version,
            status=Host.Status.ONLINE if online else Host.Status.OFFLINE,
        )
        host.refresh_from_db()
        hosts.append(host)
    return hosts


def _received(channel: str) -> dict[str, Any] | None:
    async def receive() -> dict[str, Any] | None:
        try:
            message = await asyncio.wait_for(get_channel_layer().receive(channel), timeout=2)
        except asyncio.TimeoutError:
            return None
        return json.loads(message["frame"])

    return async_to_sync(receive)()


def _rows(rollout: Rollout, **filters: Any) -> list[RolloutHost]:
    return list(RolloutHost.objects.filter(rollout=rollout, **filters).order_by("wave", "pk"))


def _come_back(rows: list[RolloutHost], version: str = TARGET) -> None:
    Host.objects.filter(pk__in=[r.host_id for r in rows]).update(agent_version=version)


def _says(host_id: int, rollout: Any, state: str, detail: str = "", version: str = TARGET) -> None:
    """What the host's agent says of the rollout (an ``upgrade_status``)."""
    services.record_status(
        host_id,
        UpgradeStatus(rollout_id=str(rollout), version=version, state=state, detail=detail),
    )


def _advance(capture: Any, now: Any = None) -> None:
    with capture(execute=True):
        progress.advance(now)


def test_the_waves_cut_the_fleet_at_the_percentages_named_hosts_first() -> None:
    hosts = _hosts(21)
    newer = _hosts(1, version=TARGET)[0]
    rollout = services.create([10, 50, 100], named=[hosts[5]], pause_s=0)
    rows = _rows(rollout)
    assert newer.pk not in {r.host_id for r in rows}  # already there: not part of it
    waves = [r.wave for r in rows]
    # 20 others: 10 % -> 2, 50 % -> 8 more, 100 % -> 10 more; the named host alone first.
    assert [waves.count(w) for w in (1, 2, 3, 4)] == [1, 2, 8, 10]
    assert rows[0].host_id == hosts[5].pk
    assert rollout.waves == 4
    with pytest.raises(services.RolloutError, match="abort it first"):
        services.create([100])


def test_bad_input_is_refused_in_words() -> None:
    for text, words in [
        ("", "at least one"),
        ("10,5", "larger than the one before"),
        ("0,100", "from 1 to 100"),
        ("ten", "not a list"),
        (",".join(str(i) for i in range(1, 13)), "at most"),
    ]:
        with pytest.raises(services.RolloutError, match=words):
            services.parse_percents(text)
    with pytest.raises(services.RolloutError, match="no single host"):
        services.find_hosts("nosuchhost")
    _hosts(1, version=TARGET)
    with pytest.raises(services.RolloutError, match="nothing to roll out"):
        services.create([100])


def test_a_healthy_rollout_goes_wave_by_wave_to_every_host(
    django_capture_on_commit_callbacks: Any,
) -> None:
    hosts = _hosts(10)
    old_agent = _hosts(1, version="0.2.0")[0]
    rollout = services.create([20, 100], pause_s=0)
    assert _rows(rollout, host=old_agent)[0].state == State.LEFT_BEHIND
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    wave1 = _rows(rollout, wave=1)
    assert [r.state for r in wave1] == [State.SENT, State.SENT]
    for row in wave1:
        frame = _received(row.host.channel_name)
        assert frame == {
            "type": "upgrade",
            "v": 1,
            "rollout_id": str(rollout.pk),
            "version": TARGET,
        }
    # Wave 2 has not started: its hosts heard nothing.
    assert all(_received(r.host.channel_name) is None for r in _rows(rollout, wave=2)[:2])
    _come_back(wave1)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=5))
    assert {r.state for r in _rows(rollout, wave=1)} == {State.UPGRADED}
    assert Rollout.objects.get(pk=rollout.pk).wave == 1  # still watched
    # The watch is over: the wave has settled, the pause (0 s) is over, wave 2 goes out.
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=70))
    rollout.refresh_from_db()
    assert rollout.wave == 2
    wave2 = _rows(rollout, wave=2)
    assert {r.state for r in wave2} == {State.SENT}
    _come_back(wave2)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=75))
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=140))
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.DONE
    assert {r.state for r in _rows(rollout) if r.host_id != old_agent.pk} == {State.UPGRADED}
    assert len(hosts) == 10


def test_a_wave_that_fails_pauses_the_rollout_and_rolls_back_the_hosts_that_switched(
    django_capture_on_commit_callbacks: Any,
) -> None:
    _hosts(20)
    rollout = services.create([10, 100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    first, second = _rows(rollout, wave=1)
    for row in (first, second):
        assert _received(row.host.channel_name)["type"] == "upgrade"
    # One fails its smoke test (nothing switched); the other comes back at the version.
    _says(first.host_id, rollout.pk, "failed", "smoke failed")
    _come_back([second])
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PAUSED
    assert "wave 1: 1 of 2 hosts failed" in rollout.reason
    assert "smoke failed" in rollout.reason
    # Only the one that runs the version goes back.
    assert _received(first.host.channel_name) is None
    assert _received(second.host.channel_name) == {
        "type": "rollback",
        "v": 1,
        "rollout_id": str(rollout.pk),
        "version": OLD,
    }
    assert _rows(rollout, pk=second.pk)[0].state == State.ROLLING_BACK
    # Wave 2 is never told anything while paused.
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=120))
    assert {r.state for r in _rows(rollout, wave=2)} == {State.PENDING}
    # It comes back at its old version: rolled back.
    _come_back([second], OLD)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=121))
    assert _rows(rollout, pk=second.pk)[0].state == State.ROLLED_BACK
    # One click: abort; nothing more is sent.
    services.abort(rollout.pk)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=500))
    assert {r.state for r in _rows(rollout, wave=2)} == {State.PENDING}
    with pytest.raises(services.RolloutError, match="aborted"):
        services.resume(rollout.pk)


def _went_offline(host_id: int, at: Any) -> None:
    transition = HostTransition.objects.create(
        host_id=host_id, from_status="online", to_status="offline", reason="no heartbeat"
    )
    HostTransition.objects.filter(pk=transition.pk).update(at=at)


def test_a_host_that_loses_its_heartbeats_after_the_upgrade_is_rolled_back_even_offline(
    django_capture_on_commit_callbacks: Any,
) -> None:
    _hosts(10)
    rollout = services.create([10, 100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    (row,) = _rows(rollout, wave=1)
    assert _received(row.host.channel_name)["type"] == "upgrade"
    _come_back([row])
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    assert _rows(rollout, pk=row.pk)[0].state == State.UPGRADED
    # The sweep marks it offline 5 s later; its socket is still open.
    _went_offline(row.host_id, now + timedelta(seconds=6))
    Host.objects.filter(pk=row.host_id).update(status=Host.Status.OFFLINE)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=7))
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PAUSED
    assert "lost its heartbeats 5 s after it came back at 0.4.0" in rollout.reason
    assert _received(row.host.channel_name)["type"] == "rollback"


def test_failures_no_worse_than_the_rest_of_the_fleet_do_not_stop_it(
    django_capture_on_commit_callbacks: Any,
) -> None:
    hosts = _hosts(10)
    rollout = services.create([50, 100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    wave1 = _rows(rollout, wave=1)
    _come_back(wave1)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    # A power cut: one upgraded host and most of the others go offline alike.
    others = [h.pk for h in hosts if h.pk not in {r.host_id for r in wave1}]
    for host_id in [wave1[0].host_id, *others[:4]]:
        _went_offline(host_id, now + timedelta(seconds=2))
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=3))
    rollout.refresh_from_db()
    assert _rows(rollout, pk=wave1[0].pk)[0].state == State.FAILED
    # 1 of 5 failed (20 %) against 4 of 5 others offline (80 %): not the release's doing.
    assert rollout.state == Rollout.State.RUNNING, rollout.reason


def test_resume_accepts_the_wave_and_goes_on(django_capture_on_commit_callbacks: Any) -> None:
    _hosts(4)
    rollout = services.create([25, 100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    (row,) = _rows(rollout, wave=1)
    _says(row.host_id, rollout.pk, "failed", "x")
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    assert Rollout.objects.get(pk=rollout.pk).state == Rollout.State.PAUSED
    services.resume(rollout.pk)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=2))
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.RUNNING
    assert rollout.wave == 2
    assert {r.state for r in _rows(rollout, wave=2)} == {State.SENT}


def test_hosts_in_a_rental_s_first_minutes_wait_unless_forced(
    django_capture_on_commit_callbacks: Any,
) -> None:
    (host,) = _hosts(1)
    lease = f.start_lease(host)
    assert lease.state in Lease.ACTIVE_STATES
    rollout = services.create([100], pause_s=0)
    _advance(django_capture_on_commit_callbacks)
    (row,) = _rows(rollout)
    assert row.state == State.PENDING
    assert "rental started" in row.detail
    assert _received(host.channel_name) is None
    services.abort(rollout.pk)
    forced = services.create([100], pause_s=0, force=True)
    _advance(django_capture_on_commit_callbacks)
    assert _rows(forced)[0].state == State.SENT


def test_an_offline_host_is_left_behind_then_joins_when_it_connects(
    django_capture_on_commit_callbacks: Any,
) -> None:
    (online,) = _hosts(1)
    (offline,) = _hosts(1, online=False)
    rollout = services.create([100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    _come_back(_rows(rollout, host=online))
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=70))
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=71))
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.DONE
    assert _rows(rollout, host=offline)[0].state == State.PENDING
    channel = async_to_sync(get_channel_layer().new_channel)()
    Host.objects.filter(pk=offline.pk).update(status=Host.Status.ONLINE, channel_name=channel)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=80))
    assert _rows(rollout, host=offline)[0].state == State.SENT
    assert _received(channel)["type"] == "upgrade"


def test_an_agent_that_cannot_upgrade_itself_is_left_behind_with_its_reason(
    django_capture_on_commit_callbacks: Any,
) -> None:
    (host,) = _hosts(1)
    rollout = services.create([100], pause_s=0)
    _advance(django_capture_on_commit_callbacks)
    _says(
        host.pk,
        rollout.pk,
        "refused",
        "this agent runs from /src/.venv, not from an installer's <prefix>/venv",
    )
    row = _rows(rollout)[0]
    assert row.state == State.LEFT_BEHIND
    assert "installer" in row.detail
    # A status for a rollout or host it does not know changes nothing.
    _says(host.pk, "6f1c1c3e-1b1a-4f0e-9a51-2c3c1c1c1c1c", "failed")


def test_a_host_that_never_comes_back_fails_after_the_timeout(
    django_capture_on_commit_callbacks: Any,
) -> None:
    _hosts(1)
    rollout = services.create([100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=301))
    row = _rows(rollout)[0]
    assert row.state == State.FAILED
    assert "did not come back at 0.4.0 within 300 s" in row.detail
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PAUSED


@override_settings(ROLLOUT_CRASHLOOP_RESTARTS=3)
def test_a_host_that_keeps_coming_back_on_new_connections_is_a_crash_loop(
    django_capture_on_commit_callbacks: Any,
) -> None:
    _hosts(10)
    rollout = services.create([10, 100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    (row,) = _rows(rollout, wave=1)
    _come_back([row])
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    # Restarts quicker than the offline deadline: never offline, a new socket each time (and
    # once, between two, no socket at all: that is not a restart of its own).
    for n, channel in enumerate(["", "specific.b", "specific.c", "specific.d"], start=2):
        Host.objects.filter(pk=row.host_id).update(channel_name=channel)
        _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=n))
        if n < 5:
            assert _rows(rollout, pk=row.pk)[0].state == State.UPGRADED
    row.refresh_from_db()
    assert row.detail == "restarted 3 times in 4 s at 0.4.0 (a crash loop)"
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PAUSED
    assert "a crash loop" in rollout.reason
    assert row.state == State.ROLLING_BACK  # it runs the version: it goes back


def test_an_upgrade_told_to_a_dead_socket_is_told_again_on_the_new_one(
    django_capture_on_commit_callbacks: Any,
) -> None:
    (host,) = _hosts(1)
    rollout = services.create([100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    assert _rows(rollout)[0].state == State.SENT
    # The agent reconnected before it read the frame: a new socket, the old version, no word.
    fresh = async_to_sync(get_channel_layer().new_channel)()
    Host.objects.filter(pk=host.pk).update(channel_name=fresh)
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=2))
    row = _rows(rollout)[0]
    assert row.state == State.SENT
    assert row.channel == fresh
    assert _received(fresh)["type"] == "upgrade"


def test_a_host_of_a_stopped_wave_that_gets_there_late_is_rolled_back_too(
    django_capture_on_commit_callbacks: Any,
) -> None:
    _hosts(10)
    rollout = services.create([20, 100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    failing, slow = _rows(rollout, wave=1)
    _says(failing.host_id, rollout.pk, "failed", "x")
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    assert Rollout.objects.get(pk=rollout.pk).state == Rollout.State.PAUSED
    assert _received(slow.host.channel_name)["type"] == "upgrade"
    _come_back([slow])  # its upgrade was already under way
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=2))
    assert _rows(rollout, pk=slow.pk)[0].state == State.ROLLING_BACK
    assert _received(slow.host.channel_name)["type"] == "rollback"


def test_resuming_an_admin_s_pause_does_not_excuse_the_wave(
    django_capture_on_commit_callbacks: Any,
) -> None:
    _hosts(10)
    rollout = services.create([20, 100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    services.pause(rollout.pk, "paused by admin")
    services.resume(rollout.pk)
    first, _ = _rows(rollout, wave=1)
    _says(first.host_id, rollout.pk, "failed", "x")
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PAUSED
    assert rollout.self_paused


def test_a_rollback_that_fails_or_goes_unanswered_is_settled_or_told_again(
    django_capture_on_commit_callbacks: Any,
) -> None:
    _hosts(10)
    rollout = services.create([20, 100], pause_s=0)
    now = timezone.now()
    _advance(django_capture_on_commit_callbacks, now)
    first, second = _rows(rollout, wave=1)
    _come_back([first, second])
    _advance(django_capture_on_commit_callbacks, now + timedelta(seconds=1))
    services.pause(rollout.pk, "admin")
    with django_capture_on_commit_callbacks(execute=True):
        progress._stop_wave(Rollout.objects.get(pk=rollout.pk), "wave 1: test")
    for row in (first, second):
        _received(row.host.channel_name)  # the upgrade
        assert _received(row.host.channel_name)["type"] == "rollback"
    _says(first.host_id, rollout.pk, "failed", "lock held", version=OLD)
    row = _rows(rollout, pk=first.pk)[0]
    assert row.state == State.FAILED
    assert row.detail == "rollback failed: lock held"
    # The other never answers: told again once the host timeout has passed.
    _advance(django_capture_on_commit_callbacks, timezone.now() + timedelta(seconds=400))
    _advance(django_capture_on_commit_callbacks, timezone.now() + timedelta(seconds=401))
    assert _received(second.host.channel_name)["type"] == "rollback"


def test_only_the_latest_rollout_moves_and_its_sends_are_capped_per_tick(
    django_capture_on_commit_callbacks: Any,
) -> None:
    (late,) = _hosts(1, online=False)
    _hosts(5)
    old = services.create([100], pause_s=0)
    services.abort(old.pk)
    newer = services.create([100], pause_s=0)
    channel = async_to_sync(get_channel_layer().new_channel)()
    Host.objects.filter(pk=late.pk).update(status=Host.Status.ONLINE, channel_name=channel)
    with override_settings(ROLLOUT_SEND_PER_TICK=2):
        _advance(django_capture_on_commit_callbacks)
        assert len(_rows(newer, state=State.SENT)) == 2
        _advance(django_capture_on_commit_callbacks)
        assert len(_rows(newer, state=State.SENT)) == 4
    assert {r.state for r in _rows(old)} == {State.PENDING}


def test_named_hosts_that_need_nothing_make_no_wave_of_their_own() -> None:
    (already,) = _hosts(1, version=TARGET)
    _hosts(4)
    rollout = services.create([50, 100], named=[already], pause_s=0)
    assert not rollout.named_first
    assert rollout.waves == 2
    assert sorted({r.wave for r in _rows(rollout)}) == [1, 2]
