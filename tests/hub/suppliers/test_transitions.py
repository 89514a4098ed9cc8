"""Every status and maintenance change of a host goes through hub/suppliers/transitions.py and
leaves its transition row (issue 15 item 1): the sweep, heartbeats, the supplier's page and
both of the admin's ways (the drain action and the change form). Going offline and coming
back carry their leases along through hub/leases/host_status.py, in the same transaction."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from hub.leases import host_status
from hub.suppliers.models import Host, HostTransition
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


def _reasons(host: Host) -> list[tuple[str, str, str]]:
    return list(
        HostTransition.objects.filter(host=host)
        .order_by("at", "pk")
        .values_list("from_status", "to_status", "reason")
    )


def test_offline_and_back_are_compare_and_set_with_one_row_each() -> None:
    host = f.register_host()
    lease = f.run_lease(host)
    now = timezone.now()
    assert host_status.host_lost(host.pk, "no heartbeat", now)
    assert not host_status.host_lost(host.pk, "no heartbeat", now)  # a racing sweep
    lease.refresh_from_db()
    assert lease.host_lost_since == now  # the grace clock started with the status change
    assert host_status.host_back(host.pk, "heartbeat", now)
    assert not host_status.host_back(host.pk, "heartbeat (telemetry flush)", now)
    lease.refresh_from_db()
    assert lease.host_lost_since is None
    assert _reasons(host)[-2:] == [
        ("online", "offline", "no heartbeat"),
        ("offline", "online", "heartbeat"),
    ]


def test_maintenance_changes_leave_rows_from_every_door() -> None:
    host = f.register_host()
    admin = f.make_user("admin", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(admin)
    changelist = reverse("admin:suppliers_host_changelist")
    client.post(changelist, {"action": "drain", "_selected_action": [host.pk]})
    client.post(changelist, {"action": "drain", "_selected_action": [host.pk]})  # twice: once
    host.refresh_from_db()
    assert host.maintenance
    supplier = Client()
    supplier.force_login(host.owner)
    supplier.post(reverse("web:host-maintenance", args=[host.pk]), {"maintenance": "off"})
    host.refresh_from_db()
    assert not host.maintenance
    reasons = [reason for _, _, reason in _reasons(host)]
    assert reasons[-2:] == [
        f"maintenance on: drained by admin {admin}",
        "maintenance off: by its supplier",
    ]
    # The change form's checkbox goes the same way.
    page = client.get(reverse("admin:suppliers_host_change", args=[host.pk]))
    form = page.context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k in form.fields}
    data.update({"maintenance": "on"})
    for prefix in ("gpus", "transitions"):
        data.update({f"{prefix}-TOTAL_FORMS": "0", f"{prefix}-INITIAL_FORMS": "0"})
    response = client.post(reverse("admin:suppliers_host_change", args=[host.pk]), data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    host.refresh_from_db()
    assert host.maintenance
    assert _reasons(host)[-1][2] == f"maintenance on: set by admin {admin}"
