from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction

from hub.accounts.models import User
from hub.billing import services as billing
from hub.billing.models import LedgerEntry
from hub.billing.payments import record_payment
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

Kind = LedgerEntry.Kind


@pytest.fixture
def admin_user() -> User:
    return f.make_user("admin", is_staff=True)


@pytest.fixture
def person() -> User:
    return f.make_user("person")


def test_a_balance_is_the_sum_of_the_ledger(person: User, admin_user: User) -> None:
    assert billing.balance_micros(person) == 0
    billing.adjust(person, 5_000_000, "welcome credit", admin_user)
    billing.adjust(person, -1_500_000, "correction", admin_user)

    assert billing.balance_micros(person) == 3_500_000
    assert billing.balances_of([person.pk, admin_user.pk]) == {
        person.pk: 3_500_000,
        admin_user.pk: 0,
    }
    entry = LedgerEntry.objects.filter(account=person).earliest("id")
    assert (entry.kind, entry.reason, entry.created_by) == (
        Kind.ADJUSTMENT,
        "welcome credit",
        admin_user,
    )


def test_adjust_needs_a_reason_an_amount_and_staff(person: User, admin_user: User) -> None:
    with pytest.raises(billing.BillingError, match="reason"):
        billing.adjust(person, 1, "  ", admin_user)
    with pytest.raises(billing.BillingError, match="zero"):
        billing.adjust(person, 0, "nothing", admin_user)
    with pytest.raises(billing.BillingError, match="staff"):
        billing.adjust(person, 1, "self service", person)
    assert not LedgerEntry.objects.exists()


def test_the_database_refuses_rows_that_break_the_books(person: User) -> None:
    bad_rows = [
        LedgerEntry(account=person, kind=Kind.FEE, amount_micros=1),  # fees are the platform's
        LedgerEntry(account=None, kind=Kind.CHARGE, amount_micros=-1),  # charges are a person's
        LedgerEntry(account=person, kind=Kind.CHARGE, amount_micros=5),  # a charge takes money
        LedgerEntry(account=person, kind=Kind.ADJUSTMENT, amount_micros=5),  # no reason, no one
    ]
    for row in bad_rows:
        with pytest.raises(IntegrityError), transaction.atomic():
            row.save()


def test_a_payment_is_recorded_once_by_its_reference(person: User) -> None:
    entry, created = record_payment(person, 20_000_000, processor="stripe", external_ref="pi_1")
    again, created_again = record_payment(
        person, 20_000_000, processor="stripe", external_ref="pi_1"
    )

    assert (created, created_again) == (True, False)
    assert again.pk == entry.pk
    assert (entry.kind, entry.external_ref) == (Kind.PAYMENT, "stripe:pi_1")
    assert billing.balance_micros(person) == 20_000_000


def test_a_reused_payment_reference_with_other_details_is_refused(person: User) -> None:
    record_payment(person, 20_000_000, processor="stripe", external_ref="pi_1")
    with pytest.raises(billing.BillingError, match="other details"):
        record_payment(person, 30_000_000, processor="stripe", external_ref="pi_1")
    assert billing.balance_micros(person) == 20_000_000
