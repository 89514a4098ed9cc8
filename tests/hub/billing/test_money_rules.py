"""A Hypothesis state machine over the market's money rules (issue 14).

Random rents (with the price the renter saw, or one since raised), agent answers, stops,
releases that fail or come late, outages before and during running, price changes, top-ups
and billing sweeps, on the real services and Postgres, with a clock the machine advances. After
every step it checks, against its own record of what happened (not the metering code):

- charges = earnings + fees, exactly, lease by lease, and each lease's total is its rows' sum;
- nothing is charged after a stop request or for time the host was away while running; a lease
  whose bill is closed was charged exactly its running time less its outages, to the second;
- no rent starts that the renter's balance cannot carry a minute of, on top of every other
  active rental of theirs;
- no lease costs more than the maximum the renter agreed to;
- no account is paid out, or holds requests for, more than it earned (issue 33: top-ups are
  never payable), and a payout is refused exactly when it asks for more than that.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.conf import settings as django_settings
from django.db.models import Sum
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from hub.billing import metering, payouts
from hub.billing import services as billing
from hub.billing.models import LedgerEntry, Payout
from hub.leases import funds
from hub.leases import services as leases
from hub.leases.models import Command, Lease
from hub.suppliers import services as suppliers
from hub.suppliers.models import Gpu
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

UNIT = 1_000_000
Kind = LedgerEntry.Kind
State = Lease.State
PRICES = [0, 1, UNIT // 2, 36 * UNIT, 36 * UNIT, 300 * UNIT]
GPUS = 3


@dataclass
class Rental:
    """What the machine itself knows about a lease."""

    id: object
    renter: int
    price: int
    max_price: int | None
    running_at: datetime | None = None
    stop_at: datetime | None = None
    over: bool = False


@dataclass
class Outage:
    start: datetime
    end: datetime | None = None


def _overlap(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> timedelta:
    return max(timedelta(0), min(a1, b1) - max(a0, b0))


class MoneyRules(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = timezone.now()
        self.admin = f.make_user("admin", is_staff=True)
        self.renters = [f.make_user("renter"), f.make_user("renter")]
        for renter in self.renters:
            # A dollar: a minute of a $36/h GPU fits, a minute of two does not.
            billing.adjust(renter, UNIT, "opening balance", self.admin)
        self.host = f.register_host(gpus=list(range(GPUS)))
        self.supplier = self.host.owner
        # Renters and the supplier alike may ask for money out; renters hold only top-ups.
        self.payees = [*self.renters, self.supplier]
        self.gpu_ids = dict(Gpu.objects.filter(host=self.host).values_list("index", "pk"))
        Gpu.objects.filter(host=self.host).update(price_per_hour_micros=36 * UNIT)
        self.rentals: dict[str, Rental] = {}
        self.outages: list[Outage] = []

    # --- the world -------------------------------------------------------------------------

    @rule(seconds=st.integers(1, 900))
    def advance(self, seconds: int) -> None:
        self.clock += timedelta(seconds=seconds)

    @rule(index=st.integers(0, GPUS - 1), price=st.sampled_from(PRICES))
    def supplier_sets_a_price(self, index: int, price: int) -> None:
        suppliers.set_gpu_terms(self.gpu_ids[index], price_per_hour_micros=price, listed=True)

    @rule(who=st.integers(0, 1), amount=st.sampled_from([UNIT // 100, UNIT, 10 * UNIT]))
    def top_up(self, who: int, amount: int) -> None:
        billing.adjust(self.renters[who], amount, "top-up", self.admin)

    @precondition(lambda self: not self._away())
    @rule()
    def host_goes_away(self) -> None:
        leases.note_host_lost(self.host.pk, self.clock)
        self.outages.append(Outage(self.clock))

    @precondition(lambda self: not self._away())
    @rule(seconds=st.integers(1, 120))
    def host_blips(self, seconds: int) -> None:
        """Away and back in one step: outages short enough to fall before a start."""
        self.host_goes_away()
        self.advance(seconds)
        self.host_comes_back()

    @precondition(lambda self: self._away())
    @rule()
    def host_comes_back(self) -> None:
        leases.note_host_back(self.host.pk, self.clock)
        self.outages[-1].end = self.clock

    @rule()
    def billing_sweep(self) -> None:
        funds.charge_and_release(now=self.clock)
        # The funds sweep may have stopped leases of renters who ran out: learn when.
        for rental in self._live():
            stop = Lease.objects.values_list("stop_requested_at", flat=True).get(pk=rental.id)
            if stop is not None and rental.stop_at is None:
                assert stop == self.clock
                rental.stop_at = stop

    # --- the renter ------------------------------------------------------------------------

    @precondition(lambda self: not self._away())
    @rule(
        who=st.integers(0, 1),
        index=st.integers(0, GPUS - 1),
        seen=st.sampled_from(["current", "stale", "none", "generous"]),
        stale_price=st.sampled_from(PRICES),
    )
    def rent(self, who: int, index: int, seen: str, stale_price: int) -> None:
        renter = self.renters[who]
        price = Gpu.objects.values_list("price_per_hour_micros", flat=True).get(
            pk=self.gpu_ids[index]
        )
        max_price = {
            "current": price,
            "stale": stale_price,  # what the page showed before the supplier's change
            "none": None,
            "generous": price + UNIT,
        }[seen]
        burn_before = billing.committed_burn_per_hour(renter.pk)
        balance = billing.balance_micros(renter)
        try:
            lease = leases.start_lease(
                renter, self.host, [index], f.lease_spec(), max_price_per_hour_micros=max_price
            )
        except leases.PriceChanged:
            assert max_price is not None
            assert price > max_price
            return
        except leases.LeaseError as exc:
            if "out of funds" in str(exc):
                assert price > 0
                assert balance < metering.per_minute(burn_before + price)
            return
        # Started: at a price within what the renter agreed to, on funds for a minute of all.
        assert max_price is None or lease.price_per_hour_micros <= max_price
        assert lease.price_per_hour_micros == price
        if price:
            assert balance >= metering.per_minute(burn_before + price)
        self.rentals[str(lease.pk)] = Rental(lease.pk, renter.pk, price, max_price)

    @precondition(lambda self: not self._away() and self._in_state(State.RESERVING))
    @rule(data=st.data(), ok=st.booleans())
    def agent_answers_the_reserve(self, data: st.DataObject, ok: bool) -> None:
        self.answer_reserve(data.draw(st.sampled_from(self._in_state(State.RESERVING))), ok)

    def answer_reserve(self, rental: Rental, ok: bool) -> None:
        f.ack(
            self._command(rental, Command.Kind.RESERVE),
            ok=ok,
            error=None if ok else "GPU busy",
            now=self.clock,
        )
        if not ok:
            rental.over = True

    @precondition(lambda self: not self._away() and self._in_state(State.STARTING))
    @rule(data=st.data())
    def container_starts(self, data: st.DataObject) -> None:
        self.start_container(data.draw(st.sampled_from(self._in_state(State.STARTING))))

    def start_container(self, rental: Rental) -> None:
        assert f.ack(
            self._command(rental, Command.Kind.DOCKER_RUN),
            result={"container_id": "c"},
            now=self.clock,
        )
        rental.running_at = self.clock

    @precondition(lambda self: self._stoppable())
    @rule(data=st.data())
    def renter_stops(self, data: st.DataObject) -> None:
        self.stop(data.draw(st.sampled_from(self._stoppable())))

    def stop(self, rental: Rental) -> None:
        leases.release_lease(rental.id, now=self.clock)
        rental.stop_at = self.clock

    @precondition(lambda self: not self._away() and self._releasing())
    @rule(data=st.data(), ok=st.booleans())
    def agent_answers_the_release(self, data: st.DataObject, ok: bool) -> None:
        self.answer_release(data.draw(st.sampled_from(self._releasing())), ok)

    def answer_release(self, rental: Rental, ok: bool) -> None:
        release = self._command(rental, Command.Kind.RELEASE)
        f.ack(release, ok=ok, error=None if ok else "container would not stop", now=self.clock)
        if ok:
            rental.over = True

    # --- money out -------------------------------------------------------------------------

    @rule(who=st.integers(0, 2), amount=st.sampled_from([UNIT // 100, UNIT // 10, UNIT, 10 * UNIT]))
    def someone_asks_for_a_payout(self, who: int, amount: int) -> None:
        account = self.payees[who]
        earned = self._sum(account, Kind.EARNING) + self._sum(account, Kind.PAYOUT)
        held = self._held(account)
        room = min(earned, billing.balance_micros(account)) - held
        try:
            payouts.request_payout(account, amount)
        except billing.BillingError:
            assert amount > room or amount < settings_minimum()
            return
        assert amount <= room
        assert amount >= settings_minimum()

    @precondition(lambda self: Payout.objects.filter(state=Payout.State.REQUESTED).exists())
    @rule(data=st.data(), pay=st.booleans())
    def admin_handles_a_payout(self, data: st.DataObject, pay: bool) -> None:
        ids = list(Payout.objects.filter(state=Payout.State.REQUESTED).values_list("pk", flat=True))
        payout_id = data.draw(st.sampled_from(sorted(ids)))
        if not pay:
            assert payouts.cancel_payout(payout_id, self.admin)
            return
        payout = Payout.objects.get(pk=payout_id)
        if billing.balance_micros(payout.account) >= payout.amount_micros:
            payouts.mark_payout_paid(payout_id, "transfer", self.admin)
        else:
            with pytest.raises(billing.BillingError, match="less than the payout"):
                payouts.mark_payout_paid(payout_id, "transfer", self.admin)

    # --- the rules ---------------------------------------------------------------------------

    @invariant()
    def nobody_is_paid_more_than_they_earned(self) -> None:
        for account in self.payees:
            paid = -self._sum(account, Kind.PAYOUT)
            assert paid + self._held(account) <= self._sum(account, Kind.EARNING)
            assert 0 <= payouts.payable_micros(account) <= max(0, billing.balance_micros(account))
        for renter in self.renters:  # they never earn: nothing of theirs is ever payable
            assert payouts.payable_micros(renter) == 0

    @invariant()
    def charges_equal_earnings_plus_fees(self) -> None:
        for rental in self.rentals.values():
            sums = dict(
                LedgerEntry.objects.filter(lease_id=rental.id)
                .values("kind")
                .annotate(total=Sum("amount_micros"))
                .values_list("kind", "total")
            )
            charged = -sums.get(Kind.CHARGE, 0)
            assert charged == sums.get(Kind.EARNING, 0) + sums.get(Kind.FEE, 0)
            lease = Lease.objects.get(pk=rental.id)
            assert lease.charged_micros == charged
            assert lease.price_per_hour_micros == rental.price
            assert rental.max_price is None or rental.price <= rental.max_price

    @invariant()
    def nothing_is_charged_after_stop_or_while_away(self) -> None:
        for rental in self.rentals.values():
            lease = Lease.objects.get(pk=rental.id)
            assert lease.stop_requested_at == rental.stop_at
            if rental.running_at is None:
                assert lease.charged_micros == 0
                continue
            ceiling = self._due(rental, self.clock)
            assert lease.charged_micros <= ceiling
            last = (
                LedgerEntry.objects.filter(lease_id=rental.id, kind=Kind.CHARGE)
                .order_by("-covers_until")
                .values_list("covers_until", flat=True)
                .first()
            )
            if last is not None and rental.stop_at is not None:
                assert last <= rental.stop_at
            if lease.billing_settled_at is not None:
                # Closed: exactly its running time up to the stop, less the time away.
                assert lease.charged_micros == ceiling

    # --- helpers -----------------------------------------------------------------------------

    def _sum(self, account: object, kind: str) -> int:
        rows = LedgerEntry.objects.filter(account=account, kind=kind)
        return int(rows.aggregate(total=Sum("amount_micros"))["total"] or 0)

    def _held(self, account: object) -> int:
        rows = Payout.objects.filter(account=account, state=Payout.State.REQUESTED)
        return int(rows.aggregate(total=Sum("amount_micros"))["total"] or 0)

    def _command(self, rental: Rental, kind: str) -> Command:
        return Command.objects.filter(lease_id=rental.id, kind=kind).latest("created_at")

    def _away(self) -> bool:
        return bool(self.outages) and self.outages[-1].end is None

    def _live(self) -> list[Rental]:
        return [r for r in self.rentals.values() if not r.over]

    def _in_state(self, state: str) -> list[Rental]:
        ids = set(
            Lease.objects.filter(pk__in=[r.id for r in self._live()], state=state).values_list(
                "pk", flat=True
            )
        )
        return [r for r in self._live() if r.id in ids]

    def _stoppable(self) -> list[Rental]:
        return [r for r in self._live() if r.stop_at is None]

    def _releasing(self) -> list[Rental]:
        return [
            r
            for r in self._live()
            if Command.objects.filter(
                lease_id=r.id,
                kind=Command.Kind.RELEASE,
                state__in=[Command.State.QUEUED, Command.State.SENT],
            ).exists()
        ]

    def _due(self, rental: Rental, now: datetime) -> int:
        """What the rental may cost at most by ``now``: from running to the stop (or now), less
        the part of every outage that fell in between; whole seconds, rounded down."""
        assert rental.running_at is not None
        end = min(now, rental.stop_at) if rental.stop_at is not None else now
        span = max(timedelta(0), end - rental.running_at)
        for outage in self.outages:
            span -= _overlap(rental.running_at, end, outage.start, outage.end or now)
        seconds = max(0, span // timedelta(seconds=1))
        return rental.price * seconds // 3600


def settings_minimum() -> int:
    return int(django_settings.PAYOUT_MINIMUM_MICROS)


# Payouts from a dime (the default minimum is $10), so the short histories reach them.
@override_settings(PAYOUT_MINIMUM_MICROS=UNIT // 10)
def test_money_rules_hold_over_random_market_histories() -> None:
    run_state_machine_as_test(
        MoneyRules,
        settings=settings(
            max_examples=40,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


def _checked(machine: MoneyRules) -> None:
    machine.charges_equal_earnings_plus_fees()
    machine.nothing_is_charged_after_stop_or_while_away()


@override_settings(PAYOUT_MINIMUM_MICROS=UNIT // 10)
def test_known_history_a_renter_cannot_cash_out_a_top_up() -> None:
    """Issue 33 item 6: topped-up credit asked back as a payout; then the supplier, who earned
    a minute of a $36 GPU, may ask for that and no more."""
    machine = MoneyRules()
    machine.top_up(0, 10 * UNIT)
    with pytest.raises(billing.BillingError, match="at most"):
        payouts.request_payout(machine.renters[0], UNIT)
    machine.rent(0, 0, "current", 0)
    rental = _only_rental(machine)
    machine.answer_reserve(rental, ok=True)
    machine.start_container(rental)
    machine.advance(600)
    machine.stop(rental)
    earned = machine._sum(machine.supplier, Kind.EARNING)
    assert 0 < earned < 6 * UNIT
    assert payouts.payable_micros(machine.supplier) == earned
    machine.nobody_is_paid_more_than_they_earned()


def _only_rental(machine: MoneyRules) -> Rental:
    (rental,) = machine.rentals.values()
    return rental


def test_known_history_an_outage_while_starting() -> None:
    """The history the random walk rarely finds (issue 14 item 2): away while the container is
    still being set up, then running; the outage must not come off the running time."""
    machine = MoneyRules()
    machine.rent(0, 0, "current", 0)
    machine.host_blips(30)
    rental = _only_rental(machine)
    machine.answer_reserve(rental, ok=True)
    machine.advance(5)
    machine.start_container(rental)
    machine.advance(100)
    machine.stop(rental)
    _checked(machine)
    assert Lease.objects.get(pk=rental.id).charged_micros == 36 * UNIT * 100 // 3600


def test_known_history_a_release_that_keeps_failing() -> None:
    """Issue 14 item 1: Stop, then the host fails the release for an hour of sweeps."""
    machine = MoneyRules()
    machine.rent(0, 0, "current", 0)
    rental = _only_rental(machine)
    machine.answer_reserve(rental, ok=True)
    machine.start_container(rental)
    machine.advance(40)
    machine.stop(rental)
    for _ in range(6):
        machine.advance(600)
        machine.answer_release(rental, ok=False)
        machine.billing_sweep()
        _checked(machine)
    assert Lease.objects.get(pk=rental.id).charged_micros == 36 * UNIT * 40 // 3600
