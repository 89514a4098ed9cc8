from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from hub.accounts.models import User
from hub.billing import services as billing
from hub.billing.models import LedgerEntry
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture
def person() -> User:
    return f.make_user("person")


def _superuser(client: Client) -> User:
    return get_user_model().objects.get(username="admin")


def test_the_adjust_action_asks_for_an_amount_and_a_reason(
    admin_client: Client, person: User
) -> None:
    page = admin_client.post(
        reverse("admin:accounts_user_changelist"),
        {"action": "adjust_balance", "_selected_action": [person.pk]},
    )
    assert page.status_code == 200
    assert 'name="amount"' in page.text
    assert 'name="reason"' in page.text
    assert not LedgerEntry.objects.exists()


def test_a_top_up_through_the_admin_is_a_ledger_row_with_reason_and_author(
    admin_client: Client, person: User
) -> None:
    response = admin_client.post(
        reverse("admin:accounts_user_changelist"),
        {
            "action": "adjust_balance",
            "_selected_action": [person.pk],
            "amount": "12.345678",
            "reason": "conference voucher",
            "apply": "Adjust",
        },
    )

    assert response.status_code == 302
    entry = LedgerEntry.objects.get()
    assert (entry.account, entry.kind, entry.amount_micros) == (person, "adjustment", 12_345_678)
    assert entry.reason == "conference voucher"
    assert entry.created_by == _superuser(admin_client)
    assert billing.balance_micros(person) == 12_345_678


def test_an_adjustment_without_a_reason_writes_nothing(admin_client: Client, person: User) -> None:
    page = admin_client.post(
        reverse("admin:accounts_user_changelist"),
        {
            "action": "adjust_balance",
            "_selected_action": [person.pk],
            "amount": "5",
            "reason": " ",
            "apply": "Adjust",
        },
    )
    assert page.status_code == 200  # the form again, with the error
    assert not LedgerEntry.objects.exists()


def test_the_user_list_shows_balances(admin_client: Client, person: User) -> None:
    billing.adjust(person, 1_234_567, "credit", _superuser(admin_client))
    page = admin_client.get(reverse("admin:accounts_user_changelist"))
    assert page.status_code == 200
    assert "$1.23" in page.text


def test_the_ledger_admin_is_read_only_and_searchable(admin_client: Client, person: User) -> None:
    entry = billing.adjust(person, 1_000_000, "credit", _superuser(admin_client))
    changelist = reverse("admin:billing_ledgerentry_changelist")

    assert admin_client.get(changelist).status_code == 200
    # Exact, without padding (issue 20 item 7): $1.00, never $1.000000.
    found = admin_client.get(changelist, {"q": person.username}).text
    assert found.count("$1.00<") == 1
    assert "$1.000000" not in found
    assert admin_client.get(changelist, {"kind__exact": "fee"}).status_code == 200
    change = admin_client.get(reverse("admin:billing_ledgerentry_change", args=[entry.pk]))
    assert change.status_code == 200
    assert admin_client.get(reverse("admin:billing_ledgerentry_add")).status_code == 403
    delete = reverse("admin:billing_ledgerentry_delete", args=[entry.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert LedgerEntry.objects.filter(pk=entry.pk).exists()
