"""The offline sweep tells a reconnect storm (a web process restarted, its agents coming back)
from failures (hub/agents/storm.py): it holds during the storm, and a real failure is still
detected, alone at once and inside a storm at most SWEEP_HOLD_MAX_S late."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from hub.agents import registration, storm, sweep
from hub.suppliers import liveness
from hub.suppliers.models import AgentToken, Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

FLEET = 10


@pytest.fixture(autouse=True)
def _small_fleet_thresholds() -> Iterator[None]:
    # A storm is 3 hosts and 20 % of the fleet here (20 and 5 % by default), so that a fleet of
    # ten shows both sides.
    with (
        f.private_liveness_set(),
        override_settings(SWEEP_STORM_MIN_HOSTS=3, SWEEP_STORM_PERCENT=20, SWEEP_HOLD_MAX_S=180),
    ):
        yield


@pytest.fixture
def token() -> AgentToken:
    return f.make_token()[0]


@pytest.fixture
def fleet(token: AgentToken) -> list[Host]:
    return [f.register_host(token) for _ in range(FLEET)]


def _overdue(hosts: list[Host], now: datetime) -> None:
    for host in hosts:
        f.set_liveness_deadline(host.pk, now - timedelta(seconds=1))


def _sweep(now: datetime) -> list[int]:
    # The sweep has been running without a gap up to `now` (else it would wait for Postgres'
    # deadlines too, liveness.py): the rule under test here is the storm's.
    client = liveness.sync_client()
    client.set(liveness.sweep_mark_key(), f"{client.info('server')['run_id']} {now.timestamp()!r}")
    client.delete(liveness.sweep_hold_key())
    return sweep.mark_overdue_hosts_offline(now=now)


def _reregister(token: AgentToken, host: Host) -> None:
    message = f.register_message(str(host.agent_id))
    registration.register_host(token.pk, message, f"chan-{uuid.uuid4().hex}")


def test_a_host_failing_alone_goes_offline(fleet: list[Host]) -> None:
    now = timezone.now()
    _overdue(fleet[:1], now)

    assert _sweep(now) == [fleet[0].pk]


def test_many_hosts_overdue_together_are_held_as_a_storm(fleet: list[Host]) -> None:
    now = timezone.now()
    _overdue(fleet[:5], now)

    assert _sweep(now) == []
    assert Host.objects.filter(status=Host.Status.OFFLINE).count() == 0


def test_the_last_hosts_of_a_storm_are_held_while_the_fleet_re_registers(
    token: AgentToken, fleet: list[Host]
) -> None:
    # Eight came back (re-registered) within the last HOST_OFFLINE_AFTER_S; two are still on
    # their way: fewer than the storm's three overdue, but the fleet is visibly returning.
    for host in fleet[2:]:
        _reregister(token, host)
    now = timezone.now()
    _overdue(fleet[:2], now)

    assert _sweep(now) == []


def test_two_hosts_overdue_without_a_returning_fleet_go_offline(fleet: list[Host]) -> None:
    # The control of the test above: the same two overdue, nobody re-registering.
    now = timezone.now()
    _overdue(fleet[:2], now)

    assert sorted(_sweep(now)) == sorted(h.pk for h in fleet[:2])


@override_settings(HOST_OFFLINE_AFTER_S=45)
def test_a_web_process_that_started_recently_holds_the_sweep(fleet: list[Host]) -> None:
    now = timezone.now()
    _overdue(fleet[:1], now)
    storm.note_web_started(now.timestamp() - 10)

    assert _sweep(now) == []

    # One full deadline after the start, the same lone overdue host is a failure.
    later = now + timedelta(seconds=40)
    assert _sweep(later) == [fleet[0].pk]


def test_a_hold_ends_after_sweep_hold_max_s_so_a_real_failure_is_seen(fleet: list[Host]) -> None:
    now = timezone.now()
    _overdue(fleet[:5], now)
    for host in fleet[5:]:  # the rest keep heartbeating throughout
        f.set_liveness_deadline(host.pk, now + timedelta(hours=1))
    assert _sweep(now) == []
    assert _sweep(now + timedelta(seconds=170)) == []  # still within the bound

    went = _sweep(now + timedelta(seconds=181))

    assert sorted(went) == sorted(h.pk for h in fleet[:5])


def test_a_storm_after_a_calm_sweep_is_held_afresh(fleet: list[Host]) -> None:
    now = timezone.now()
    _overdue(fleet[:5], now)
    for host in fleet[5:]:
        f.set_liveness_deadline(host.pk, now + timedelta(hours=1))
    assert _sweep(now) == []
    for host in fleet[:5]:  # they all came back
        f.set_liveness_deadline(host.pk, now + timedelta(hours=1))
    assert _sweep(now + timedelta(seconds=60)) == []  # calm: the hold's clock is dropped

    # A second storm, long after the first began: held, not cut short by the first's clock.
    much_later = now + timedelta(seconds=600)
    _overdue(fleet[:5], much_later)
    assert _sweep(much_later) == []
