from __future__ import annotations

import pytest

from hub.accounts.models import User
from hub.accounts.services import create_demo_accounts


@pytest.mark.django_db
def test_demo_accounts_are_created_once_with_working_passwords() -> None:
    created = create_demo_accounts()
    assert [a.username for a in created] == ["admin", "renter", "supplier"]
    admin = User.objects.get(username="admin")
    assert admin.is_superuser
    assert admin.is_staff
    assert not User.objects.get(username="renter").is_staff
    for account in created:
        assert User.objects.get(username=account.username).check_password(account.password)

    assert create_demo_accounts() == []
    assert User.objects.count() == 3
