"""Enrollment codes in the admin: visible to staff, changeable by nobody."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from hub.installer import enrollment
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


def test_codes_are_listed_and_shown_but_never_added_changed_or_deleted(
    admin_client: Client,
) -> None:
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier, "rack-2")
    enrollment.exchange_enrollment_code(plaintext, address="192.0.2.7", host="gpu-box")
    code.refresh_from_db()

    changelist = admin_client.get(reverse("admin:installer_enrollmentcode_changelist"))
    search = admin_client.get(
        reverse("admin:installer_enrollmentcode_changelist"), {"q": "gpu-box"}
    )
    change_url = reverse("admin:installer_enrollmentcode_change", args=[code.pk])
    change = admin_client.get(change_url)

    assert changelist.status_code == 200
    assert search.status_code == 200
    assert code.prefix in search.content.decode()
    assert change.status_code == 200
    page = change.content.decode()
    assert "rack-2" in page
    assert "192.0.2.7" in page
    assert code.digest not in page
    assert plaintext not in page
    assert 'name="_save"' not in page  # a view-only page: no Save button

    assert admin_client.get(reverse("admin:installer_enrollmentcode_add")).status_code == 403
    assert admin_client.post(change_url, {"name": "renamed"}).status_code == 403
    delete_url = reverse("admin:installer_enrollmentcode_delete", args=[code.pk])
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    code.refresh_from_db()
    assert code.name == "rack-2"
