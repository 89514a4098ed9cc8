from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Sum
from pytest_django.fixtures import SettingsWrapper

from hub.accounts.models import User
from hub.billing import services as billing
from hub.billing.models import LedgerEntry
from hub.leases import funds
from hub.leases import services as leases
from hub.leases import tasks as lease_tasks
from hub.leases.models import Command, Lease
from hub.suppliers.models import Gpu, Host
from tests.hub import factories as f

Kind = LedgerEntry.Kind
State = Lease.State

PRICE = 3_600_000  # $3.60 an hour: exactly 1,000 micros a second
UNIT = 1_000_000


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def host(db: None) -> Host:
    return f.register_host(gpus=[0, 1])


@pytest.fixture
def admin_user(db: None) -> User:
    return f.make_user("admin", is_staff=True)


@pytest.fixture
def renter(db: None) -> User:
    return f.make_user("renter")


def _price(host: Host, micros: int, indices: tuple[int, ...] = (0,)) -> None:
    # A supplier's price change (the suppliers admin edits this column).
    Gpu.objects.filter(host=host, index__in=indices).update(price_per_hour_micros=micros)


def _fund(renter: User, micros: int, admin_user: User) -> None:
    billing.adjust(renter, micros, "test top-up", admin_user)


def _run(host: Host, renter: User, indices: list[int] | None = None) -> Lease:
    lease = leases.start_lease(renter, host, indices or [0], f.lease_spec())
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    assert f.ack(f.command_of(lease, Command.Kind.DOCKER_RUN), result={"container_id": "c0ffee"})
    lease.refresh_from_db()
    assert lease.state == State.RUNNING
    return lease


def _at(lease: Lease, seconds: float) -> datetime:
    assert lease.running_since is not None
    return lease.running_since + timedelta(seconds=seconds)


def _total(kind: str, **filters: Any) -> int:
    total = LedgerEntry.objects.filter(kind=kind, **filters).aggregate(s=Sum("amount_micros"))
    return total["s"] or 0


def _charged(lease: Lease) -> int:
    return -_total(Kind.CHARGE, lease=lease)


def _assert_books_balance() -> None:
    assert _total(Kind.EARNING) + _total(Kind.FEE) == -_total(Kind.CHARGE)


@pytest.fixture
def funded_lease(host: Host, renter: User, admin_user: User) -> Lease:
    _price(host, PRICE)
    _fund(renter, 10 * UNIT, admin_user)
    return _run(host, renter)


# --- charging -----------------------------------------------------------------------------------


def test_ninety_seconds_are_charged_exactly_and_split_with_the_fee(
    funded_lease: Lease, renter: User, host: Host
) -> None:
    run = funds.charge_and_release(now=_at(funded_lease, 90))

    assert run.charged_micros == 90_000
    assert billing.balance_micros(renter) == 10 * UNIT - 90_000
    assert billing.balance_micros(host.owner) == 81_000  # the price less the 10% fee
    assert billing.balance_micros(None) == 9_000  # the platform's account
    funded_lease.refresh_from_db()
    assert funded_lease.charged_micros == 90_000
    assert funded_lease.billed_until == _at(funded_lease, 90)
    _assert_books_balance()


def test_partial_seconds_are_not_charged(funded_lease: Lease) -> None:
    funds.charge_and_release(now=_at(funded_lease, 90.999))
    assert _charged(funded_lease) == 90_000


def test_the_price_is_the_sum_of_the_leased_gpus_fixed_at_start(
    host: Host, renter: User, admin_user: User
) -> None:
    _price(host, 1_000_000, (0,))
    _price(host, 2_600_000, (1,))
    _fund(renter, 10 * UNIT, admin_user)
    lease = _run(host, renter, [0, 1])
    assert lease.price_per_hour_micros == PRICE
    assert lease.platform_fee_bps == 1000

    _price(host, 50 * UNIT, (0, 1))  # the supplier raises the price mid-lease
    funds.charge_and_release(now=_at(lease, 90))

    assert _charged(lease) == 90_000


def test_running_the_task_twice_charges_nothing_the_second_time(funded_lease: Lease) -> None:
    now = _at(funded_lease, 300)
    first = funds.charge_and_release(now=now)
    rows = LedgerEntry.objects.count()
    second = funds.charge_and_release(now=now)

    assert (first.charged_micros, second.charged_micros) == (300_000, 0)
    assert LedgerEntry.objects.count() == rows


def test_many_small_batches_charge_what_one_big_batch_does(
    host: Host, renter: User, admin_user: User, settings: SettingsWrapper
) -> None:
    settings.PLATFORM_FEE_BPS = 333  # awkward numbers: every batch rounds
    _price(host, 1_234_567)
    _fund(renter, 100 * UNIT, admin_user)
    lease = _run(host, renter)
    assert lease.platform_fee_bps == 333

    for second in range(1, 3601, 7):
        funds.charge_and_release(now=_at(lease, second))
    funds.charge_and_release(now=_at(lease, 3600))

    charged = _charged(lease)
    assert charged == 1_234_567  # an hour, to the micro
    assert _total(Kind.FEE, lease=lease) == 1_234_567 * 333 // 10_000
    assert _total(Kind.EARNING, lease=lease) == charged - 1_234_567 * 333 // 10_000
    _assert_books_balance()


def test_a_free_lease_writes_no_ledger_rows(host: Host, renter: User) -> None:
    lease = _run(host, renter)  # price 0, balance 0: allowed
    funds.charge_and_release(now=_at(lease, 3600))
    assert not LedgerEntry.objects.exists()


def test_the_celery_task_runs_the_service(funded_lease: Lease) -> None:
    result = lease_tasks.charge_and_release.apply().get()
    assert set(result) == {"leases", "charged_micros", "warned", "released"}
    assert result["leases"] == 1
    assert result["charged_micros"] == _charged(funded_lease)


# --- host outages -------------------------------------------------------------------------------


def test_a_past_outage_is_not_charged(funded_lease: Lease, host: Host) -> None:
    leases.note_host_lost(host.pk, _at(funded_lease, 30))
    leases.note_host_back(host.pk, _at(funded_lease, 130))

    funds.charge_and_release(now=_at(funded_lease, 190))

    assert _charged(funded_lease) == 90_000  # 30 s before, 60 s after


def test_an_ongoing_outage_is_not_charged(funded_lease: Lease, host: Host) -> None:
    leases.note_host_lost(host.pk, _at(funded_lease, 60))

    funds.charge_and_release(now=_at(funded_lease, 600))
    funds.charge_and_release(now=_at(funded_lease, 900))

    assert _charged(funded_lease) == 60_000


# --- the end of a lease -------------------------------------------------------------------------


def test_a_lease_that_ends_is_settled_exactly_up_to_ended_at(
    funded_lease: Lease, host: Host
) -> None:
    funds.charge_and_release(now=_at(funded_lease, 40))
    # The host comes back without the lease: it ends at that instant.
    with transaction.atomic():
        leases.reconcile_claims(host, (), _at(funded_lease, 90))

    funded_lease.refresh_from_db()
    assert funded_lease.state == State.ENDED
    assert funded_lease.ended_at == _at(funded_lease, 90)
    assert funded_lease.billing_settled_at is not None
    assert _charged(funded_lease) == 90_000
    funds.charge_and_release(now=_at(funded_lease, 7200))
    assert _charged(funded_lease) == 90_000


def test_a_lease_ended_by_its_release_is_charged_up_to_ended_at(funded_lease: Lease) -> None:
    leases.release_lease(funded_lease.pk)
    f.ack(f.command_of(funded_lease, Command.Kind.RELEASE))
    funded_lease.refresh_from_db()
    assert funded_lease.ended_at is not None
    assert funded_lease.running_since is not None

    seconds = (funded_lease.ended_at - funded_lease.running_since) // timedelta(seconds=1)
    assert _charged(funded_lease) == PRICE * seconds // 3600
    assert funds.charge_and_release(now=_at(funded_lease, 7200)).leases == 0


def test_a_lease_lost_with_its_host_is_charged_until_the_host_went_away(
    funded_lease: Lease, host: Host, settings: SettingsWrapper
) -> None:
    leases.note_host_lost(host.pk, _at(funded_lease, 50))
    ended = leases.end_leases_of_lost_hosts(
        now=_at(funded_lease, 50 + settings.LEASE_HOST_GRACE_S + 1)
    )
    assert ended == [str(funded_lease.pk)]
    # The host returns later: its outage is recorded on the ended lease, which stays settled.
    leases.note_host_back(host.pk, _at(funded_lease, 5000))
    funds.charge_and_release(now=_at(funded_lease, 6000))

    assert _charged(funded_lease) == 50_000


def test_an_ended_lease_left_unsettled_is_settled_by_the_task(funded_lease: Lease) -> None:
    # As if it ended before billing was deployed: the task still charges it to its end, once.
    Lease.objects.filter(pk=funded_lease.pk).update(
        state=State.ENDED, ended_at=_at(funded_lease, 120)
    )
    funds.charge_and_release(now=_at(funded_lease, 3600))
    funds.charge_and_release(now=_at(funded_lease, 7200))

    funded_lease.refresh_from_db()
    assert funded_lease.billing_settled_at is not None
    assert _charged(funded_lease) == 120_000


def test_the_task_and_an_ending_lease_racing_charge_once(transactional_db: None) -> None:
    host = f.register_host(gpus=[0])
    renter = f.make_user("renter")
    _price(host, PRICE)
    _fund(renter, 10 * UNIT, f.make_user("admin", is_staff=True))
    lease = _run(host, renter)
    now = _at(lease, 90)
    barrier = threading.Barrier(2, timeout=30)
    errors: list[BaseException] = []

    def meter() -> None:
        try:
            barrier.wait()
            funds.charge_and_release(now=now)
        except BaseException as exc:  # collected and checked below
            errors.append(exc)
        finally:
            connection.close()

    def end() -> None:
        try:
            barrier.wait()
            with transaction.atomic():
                leases.reconcile_claims(host, (), now)
        except BaseException as exc:  # collected and checked below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=meter), threading.Thread(target=end)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert not errors, errors

    assert _charged(lease) == 90_000
    _assert_books_balance()


# --- funds --------------------------------------------------------------------------------------


def test_start_lease_refuses_a_priced_lease_the_renter_cannot_pay(host: Host, renter: User) -> None:
    _price(host, PRICE)
    with pytest.raises(leases.LeaseError, match=r"^out of funds: "):
        f.start_lease(host, renter=renter)
    assert not Lease.objects.exists()


def test_the_out_of_funds_message_shows_money_as_people_read_it(
    host: Host, renter: User, admin_user: User
) -> None:
    _price(host, 1_500_000)  # $1.50 an hour: its first minute is $0.025
    _fund(renter, 10_000, admin_user)  # $0.01
    with pytest.raises(leases.LeaseError) as refused:
        f.start_lease(host, renter=renter)
    message = str(refused.value)
    assert "costs $1.50 an hour" in message
    assert "its first minute needs $0.025 and your balance is $0.01;" in message
    assert "Usage page" in message
    assert not re.search(r"\$\d+\.\d{6}", message), message  # never "$0.025000"


def test_start_lease_needs_the_first_minute_of_every_running_rental(
    host: Host, renter: User, admin_user: User
) -> None:
    _price(host, PRICE, (0, 1))
    _fund(renter, 60_000, admin_user)  # exactly one minute of one GPU
    _run(host, renter, [0])
    with pytest.raises(leases.LeaseError, match="out of funds"):
        f.start_lease(host, [1], renter=renter)


def test_a_renter_running_low_is_warned_and_the_warning_clears_on_top_up(
    funded_lease: Lease, renter: User, admin_user: User
) -> None:
    # $10 at $3.60/h lasts 166 minutes; past 157 minutes less than 10 are left.
    funds.charge_and_release(now=_at(funded_lease, 150 * 60))
    funded_lease.refresh_from_db()
    assert funded_lease.funds_warning_at is None

    warn_at = _at(funded_lease, 158 * 60)
    run = funds.charge_and_release(now=warn_at)
    funded_lease.refresh_from_db()
    assert run.warned == 1
    assert funded_lease.funds_warning_at == warn_at
    assert funded_lease.state == State.RUNNING

    _fund(renter, 5 * UNIT, admin_user)
    funded_lease.refresh_from_db()
    assert funded_lease.funds_warning_at is None


def test_a_renter_out_of_funds_is_warned_then_released_with_no_funds(
    host: Host, renter: User, admin_user: User
) -> None:
    _price(host, PRICE)
    _fund(renter, 120_000, admin_user)  # two minutes
    lease = _run(host, renter)

    run = funds.charge_and_release(now=_at(lease, 30))
    lease.refresh_from_db()
    assert (run.warned, run.released) == (1, 0)
    assert lease.funds_warning_at is not None
    assert lease.state == State.RUNNING

    run = funds.charge_and_release(now=_at(lease, 70))  # 50 s (50,000) left
    lease.refresh_from_db()
    assert run.released == 1
    assert (lease.state, lease.end_reason) == (State.STOPPING, Lease.EndReason.NO_FUNDS)
    assert f.command_of(lease, Command.Kind.RELEASE).payload["reason"] == "no_funds"


def test_a_balance_at_zero_releases_every_priced_lease_of_the_renter(
    host: Host, renter: User, admin_user: User
) -> None:
    _price(host, PRICE, (0, 1))
    _fund(renter, 120_000, admin_user)
    first = _run(host, renter, [0])
    second = _run(host, renter, [1])
    # A correction takes the balance to zero: neither rental can pay its next minute.
    billing.adjust(renter, -120_000, "chargeback", admin_user)

    run = funds.charge_and_release(now=_at(second, 0))

    assert run.released == 2
    for lease in (first, second):
        lease.refresh_from_db()
        assert lease.end_reason == Lease.EndReason.NO_FUNDS


def test_free_leases_run_on_with_a_zero_balance(host: Host, renter: User) -> None:
    lease = _run(host, renter)
    run = funds.charge_and_release(now=_at(lease, 7200))
    lease.refresh_from_db()
    assert (run.warned, run.released) == (0, 0)
    assert (lease.state, lease.funds_warning_at) == (State.RUNNING, None)
