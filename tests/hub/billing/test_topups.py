"""Issue 20 item 8: a renter sees how to add funds and asks for a top-up; an admin adds it from
the person's own admin page, with the reason and their name kept, answering the request."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from hub.accounts.models import User
from hub.billing import services as billing
from hub.billing import topups
from hub.billing.models import LedgerEntry, TopUpRequest
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

UNIT = 1_000_000


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def admin() -> User:
    return get_user_model().objects.create_superuser(f"topper-{f.make_user().pk}", password=None)


def test_the_usage_page_says_how_to_add_funds_and_takes_a_request() -> None:
    renter = f.make_user("renter")
    client = _client(renter)
    page = client.get(reverse("web:usage")).content.decode()
    assert "How to add funds" in page
    response = client.post(
        reverse("web:top-up-request"),
        {"topup-amount": "25", "topup-note": "for training"},
        follow=True,
    )
    assert "Asked for $25.00" in response.content.decode()
    request = TopUpRequest.objects.get(account=renter)
    assert request.amount_micros == 25 * UNIT
    assert request.note == "for training"
    assert request.state == TopUpRequest.State.WAITING


def test_a_request_out_of_bounds_or_past_the_cap_is_refused_in_words() -> None:
    renter = f.make_user("renter")
    client = _client(renter)
    response = client.post(reverse("web:top-up-request"), {"topup-amount": "0.50"})
    assert response.status_code == 400
    assert "between $1 and $100,000" in response.content.decode()
    for _ in range(topups.MAX_WAITING):
        topups.request_top_up(renter, 5 * UNIT)
    response = client.post(reverse("web:top-up-request"), {"topup-amount": "5"})
    assert response.status_code == 400
    assert "requests waiting already" in response.content.decode()


def test_an_admin_adds_a_top_up_from_the_person_s_page_answering_the_request(admin: User) -> None:
    renter = f.make_user("renter")
    request = topups.request_top_up(renter, 25 * UNIT, "bank transfer")
    client = _client(admin)
    change = client.get(reverse("admin:accounts_user_change", args=[renter.pk])).content.decode()
    url = reverse("admin:accounts_user_adjust_balance", args=[renter.pk])
    assert f'href="{url}"' in change
    page = client.get(url).content.decode()
    assert "bank transfer" in page
    assert 'value="25.00"' in page  # the request's amount, ready to confirm
    response = client.post(
        url,
        {"amount": "25.00", "reason": "paid: transfer 4711", "answers": request.pk, "apply": "1"},
        follow=True,
    )
    assert "Adjusted the balance of" in response.content.decode()
    entry = LedgerEntry.objects.get(account=renter)
    assert entry.kind == LedgerEntry.Kind.ADJUSTMENT
    assert entry.reason == "paid: transfer 4711"
    assert entry.created_by == admin
    request.refresh_from_db()
    assert request.state == TopUpRequest.State.ADDED
    assert request.ledger_entry == entry
    assert request.handled_by == admin
    assert billing.balance_micros(renter) == 25 * UNIT
    usage = _client(renter).get(reverse("web:usage")).content.decode()
    assert "paid: transfer 4711" in usage


def test_an_admin_top_up_needs_a_reason(admin: User) -> None:
    renter = f.make_user("renter")
    url = reverse("admin:accounts_user_adjust_balance", args=[renter.pk])
    response = _client(admin).post(url, {"amount": "10", "reason": " ", "apply": "1"})
    assert response.status_code == 200
    assert not LedgerEntry.objects.filter(account=renter).exists()


def test_an_admin_declines_a_request(admin: User) -> None:
    renter = f.make_user("renter")
    request = topups.request_top_up(renter, 10 * UNIT)
    url = reverse("admin:accounts_user_adjust_balance", args=[renter.pk])
    _client(admin).post(url, {"answers": request.pk, "decline": "Decline"})
    request.refresh_from_db()
    assert request.state == TopUpRequest.State.DECLINED
    assert not LedgerEntry.objects.filter(account=renter).exists()
    with pytest.raises(billing.BillingError, match="answered already"):
        topups.add_top_up(renter, 10 * UNIT, "late", admin, answers=request.pk)


def test_staff_without_the_ledger_permission_cannot_open_the_page() -> None:
    renter = f.make_user("renter")
    staff = f.make_user("staff", is_staff=True)
    url = reverse("admin:accounts_user_adjust_balance", args=[renter.pk])
    assert _client(staff).get(url).status_code == 403
