"""Issue 20 item 4: a supplier's payable balance, payout requests through the API (their own
opt-in scope), and an admin marking one paid with a reference (a `payout` ledger row)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.test import Client
from django.urls import reverse
from rest_framework.test import APIClient

from hub.accounts.models import DEFAULT_API_SCOPES, User
from hub.billing import payouts
from hub.billing import services as billing
from hub.billing.models import LedgerEntry, Payout
from tests.hub import factories as f
from tests.hub.api.conftest import client_for, top_up

pytestmark = pytest.mark.django_db

UNIT = 1_000_000


def earn(supplier: User, micros: int) -> None:
    """An earning row, as metering writes one when a renter pays for the supplier's GPU."""
    LedgerEntry.objects.create(
        account=supplier, kind=LedgerEntry.Kind.EARNING, amount_micros=micros
    )


@pytest.fixture
def supplier() -> User:
    supplier = f.make_user("supplier")
    earn(supplier, 100 * UNIT)
    return supplier


@pytest.fixture
def admin() -> User:
    return get_user_model().objects.create_superuser(f"payer-{f.make_user().pk}", password=None)


def _payouts_api(user: User) -> APIClient:
    return client_for(user, [*DEFAULT_API_SCOPES, "payouts"])


def test_a_supplier_sees_what_is_payable_and_requests_a_payout(supplier: User) -> None:
    api = _payouts_api(supplier)
    body = api.get("/api/v1/payouts/").json()
    assert body["payable_micros"] == 100 * UNIT
    assert body["payable"] == "$100.00"
    assert body["payouts"] == []

    response = api.post("/api/v1/payouts/", {"amount": "60.00"}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["state"] == "requested"
    assert response.json()["amount"] == "$60.00"
    # Requested money is held: not payable twice, though the balance is unchanged until paid.
    assert api.get("/api/v1/payouts/").json()["payable_micros"] == 40 * UNIT
    assert billing.balance_micros(supplier) == 100 * UNIT
    refused = api.post("/api/v1/payouts/", {"amount": "50"}, format="json")
    assert refused.status_code == 400
    assert "at most $40.00" in refused.json()["detail"]


def test_topped_up_credit_is_never_payable() -> None:
    """Issue 33 item 6: a renter with only topped-up credit asked for 50 and got 'requested'."""
    renter = f.make_user("renter")
    top_up(renter, 100 * UNIT)
    api = _payouts_api(renter)
    assert api.get("/api/v1/payouts/").json()["payable_micros"] == 0
    refused = api.post("/api/v1/payouts/", {"amount": "50"}, format="json")
    assert refused.status_code == 400
    assert "at most $0.00" in refused.json()["detail"]
    assert not Payout.objects.filter(account=renter).exists()


def test_only_earnings_less_paid_and_pending_are_payable(supplier: User, admin: User) -> None:
    top_up(supplier, 50 * UNIT)  # the supplier rents too: this credit is not theirs to cash
    assert payouts.payable_micros(supplier) == 100 * UNIT
    payouts.mark_payout_paid(payouts.request_payout(supplier, 30 * UNIT).pk, "ref 1", admin)
    payouts.request_payout(supplier, 20 * UNIT)  # pending
    assert billing.balance_micros(supplier) == 120 * UNIT
    assert payouts.payable_micros(supplier) == 50 * UNIT
    with pytest.raises(billing.BillingError, match=r"at most \$50\.00"):
        payouts.request_payout(supplier, 60 * UNIT)
    # Earnings spent on rentals are gone: never more than the balance.
    billing.adjust(supplier, -110 * UNIT, "spent on rentals (stand-in)", admin)
    assert payouts.payable_micros(supplier) == 0


def _spend(account: User, micros: int) -> None:
    """A charge row, as metering writes one when the account rents a GPU itself."""
    LedgerEntry.objects.create(account=account, kind=LedgerEntry.Kind.CHARGE, amount_micros=-micros)


def test_earnings_spent_on_rentals_are_not_refilled_by_a_later_top_up(supplier: User) -> None:
    """The review's way around 'earnings less payouts': earn, spend it, top up, cash out."""
    _spend(supplier, 100 * UNIT)  # the supplier rents with all they earned
    top_up(supplier, 100 * UNIT)
    assert billing.balance_micros(supplier) == 100 * UNIT
    assert payouts.earned_micros(supplier) == 0
    assert payouts.payable_micros(supplier) == 0


def test_spending_takes_bought_credit_before_earnings(supplier: User) -> None:
    top_up(supplier, 30 * UNIT)
    _spend(supplier, 40 * UNIT)  # 30 of credit, then 10 of the earnings
    earn(supplier, 5 * UNIT)
    top_up(supplier, 50 * UNIT)  # credit again: not payable
    assert payouts.earned_micros(supplier) == 95 * UNIT
    assert payouts.payable_micros(supplier) == 95 * UNIT


def test_a_request_spent_before_it_is_paid_is_not_paid(supplier: User, admin: User) -> None:
    payout = payouts.request_payout(supplier, 80 * UNIT)
    _spend(supplier, 50 * UNIT)  # earnings the request was asked against, now spent
    top_up(supplier, 50 * UNIT)  # the balance covers it again, with bought credit
    with pytest.raises(billing.BillingError, match="of the supplier's earnings is payable"):
        payouts.mark_payout_paid(payout.pk, "ref", admin)
    assert Payout.objects.get(pk=payout.pk).state == Payout.State.REQUESTED


def test_a_payout_below_the_minimum_is_refused_in_words(supplier: User) -> None:
    response = _payouts_api(supplier).post("/api/v1/payouts/", {"amount": "2"}, format="json")
    assert response.status_code == 400
    assert "at least $10.00" in response.json()["detail"]


def test_requesting_a_payout_needs_its_own_scope(supplier: User) -> None:
    response = client_for(supplier).post("/api/v1/payouts/", {"amount": "20"}, format="json")
    assert response.status_code == 403
    assert "payouts" in response.json()["detail"]
    assert client_for(supplier).get("/api/v1/payouts/").status_code == 200


def test_an_admin_marks_a_payout_paid_with_its_reference_once(supplier: User, admin: User) -> None:
    payout = payouts.request_payout(supplier, 30 * UNIT)
    paid = payouts.mark_payout_paid(payout.pk, "  SEPA  2026-12-01 / 4711 ", admin)
    assert paid.state == Payout.State.PAID
    assert paid.reference == "SEPA 2026-12-01 / 4711"
    entry = paid.ledger_entry
    assert entry is not None
    assert entry.kind == LedgerEntry.Kind.PAYOUT
    assert entry.amount_micros == -30 * UNIT
    assert entry.created_by == admin
    assert "SEPA 2026-12-01 / 4711" in entry.reason
    assert billing.balance_micros(supplier) == 70 * UNIT
    assert payouts.payable_micros(supplier) == 70 * UNIT
    with pytest.raises(billing.BillingError, match="paid already"):
        payouts.mark_payout_paid(payout.pk, "again", admin)
    assert LedgerEntry.objects.filter(kind=LedgerEntry.Kind.PAYOUT).count() == 1
    body = _payouts_api(supplier).get("/api/v1/payouts/").json()
    assert body["payouts"][0]["state"] == "paid"
    assert body["payouts"][0]["reference"] == "SEPA 2026-12-01 / 4711"


def test_marking_paid_needs_a_reference_and_staff(supplier: User, admin: User) -> None:
    payout = payouts.request_payout(supplier, 20 * UNIT)
    with pytest.raises(billing.BillingError, match="reference"):
        payouts.mark_payout_paid(payout.pk, "   ", admin)
    with pytest.raises(billing.BillingError, match="staff"):
        payouts.mark_payout_paid(payout.pk, "ref", supplier)
    assert Payout.objects.get(pk=payout.pk).state == Payout.State.REQUESTED


def test_a_payout_the_balance_no_longer_covers_is_not_paid(supplier: User, admin: User) -> None:
    payout = payouts.request_payout(supplier, 90 * UNIT)
    billing.adjust(supplier, -50 * UNIT, "correction", admin)
    with pytest.raises(billing.BillingError, match="less than the payout"):
        payouts.mark_payout_paid(payout.pk, "ref", admin)
    assert billing.balance_micros(supplier) == 50 * UNIT


def test_a_supplier_cancels_their_own_requested_payout_only(supplier: User) -> None:
    api = _payouts_api(supplier)
    payout = payouts.request_payout(supplier, 50 * UNIT)
    other = _payouts_api(f.make_user("other"))
    assert other.post(f"/api/v1/payouts/{payout.pk}/cancel/").status_code == 404
    response = api.post(f"/api/v1/payouts/{payout.pk}/cancel/")
    assert response.status_code == 200
    assert response.json()["state"] == "cancelled"
    assert payouts.payable_micros(supplier) == 100 * UNIT
    assert api.post(f"/api/v1/payouts/{payout.pk}/cancel/").status_code == 400


def test_the_ledger_refuses_a_positive_payout_row(supplier: User) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        LedgerEntry.objects.create(
            account=supplier, kind=LedgerEntry.Kind.PAYOUT, amount_micros=UNIT
        )


def test_the_admin_page_marks_a_payout_paid(supplier: User, admin: User) -> None:
    payout = payouts.request_payout(supplier, 25 * UNIT)
    client = Client()
    client.force_login(admin)
    listing = client.get(reverse("admin:billing_payout_changelist")).content.decode()
    assert "Mark paid" in listing
    url = reverse("admin:billing_payout_mark_paid", args=[payout.pk])
    assert client.get(url).status_code == 200
    response = client.post(url, {"reference": "bank 99", "apply": "Mark paid"}, follow=True)
    assert "marked paid" in response.content.decode()
    payout.refresh_from_db()
    assert payout.state == Payout.State.PAID
    assert payout.handled_by == admin


def test_the_earnings_page_shows_payable_and_takes_a_request(supplier: User) -> None:
    client = Client()
    client.force_login(supplier)
    page = client.get(reverse("web:earnings")).content.decode()
    assert 'id="payable">$100.00<' in page
    response = client.post(reverse("web:payout-request"), {"payout-amount": "15"}, follow=True)
    assert "Payout of $15.00 requested" in response.content.decode()
    assert 'id="payable">$85.00<' in response.content.decode()
    too_much = client.post(reverse("web:payout-request"), {"payout-amount": "500"})
    assert too_much.status_code == 400
    assert "at most $85.00" in too_much.content.decode()
