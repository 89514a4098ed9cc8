"""The keep-alive limit: a beat sweep releases leases past their stop time as expired."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from hub.leases import services
from hub.leases.models import Lease
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


def test_due_leases_are_released_as_expired_and_others_are_not() -> None:
    due = f.start_lease(f.register_host(), stop_after=timedelta(hours=1))
    later = f.start_lease(f.register_host(), stop_after=timedelta(hours=3))
    unlimited = f.start_lease(f.register_host())
    now = timezone.now() + timedelta(hours=2)
    assert services.expire_due_leases(now) == [str(due.pk)]
    states = {lease.pk: lease for lease in Lease.objects.all()}
    assert states[due.pk].state == Lease.State.STOPPING
    assert states[due.pk].end_reason == Lease.EndReason.EXPIRED
    assert states[later.pk].state == Lease.State.RESERVING
    assert states[unlimited.pk].state == Lease.State.RESERVING
