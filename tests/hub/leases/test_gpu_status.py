"""Issue 20 item 1: each GPU shows one true state, whatever combination of flags is behind it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.utils import timezone

from hub.leases import services as lease_services
from hub.leases.gpu_status import gpu_statuses
from hub.leases.models import Lease
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Gpu, Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


def _state(host: Host, index: int = 0) -> tuple[str, str, str]:
    host = Host.objects.prefetch_related("gpus").get(pk=host.pk)
    gpu = host.gpus.get(index=index)
    status = gpu_statuses([host])[gpu.pk]
    return status.state, status.label, status.detail


def test_a_listed_free_gpu_on_an_online_host_is_listed_and_idle() -> None:
    assert _state(f.register_host()) == ("listed", "listed, idle", "")


def test_a_rented_gpu_says_rented_not_for_rent() -> None:
    host = f.register_host()
    f.run_lease(host)
    assert _state(host)[0] == "rented"


def test_a_rented_gpu_on_a_host_in_maintenance_is_still_rented() -> None:
    host = f.register_host(gpus=(0, 1))
    f.run_lease(host, [0])
    supplier_services.set_host_maintenance(host.pk, True)
    assert _state(host, 0)[0] == "rented"
    assert _state(host, 1) == ("maintenance", "maintenance", "no new rentals")


def test_a_gpu_on_an_offline_host_is_offline_even_when_listed_or_rented() -> None:
    host = f.register_host(gpus=(0, 1))
    f.run_lease(host, [0])
    f.take_offline(host)
    assert _state(host, 0) == ("offline", "offline", "rented, host away")
    assert _state(host, 1) == ("offline", "offline", "host offline")


def test_unpriced_and_unlisted_gpus_are_unlisted() -> None:
    token, _ = f.make_token(default_price_per_hour_micros=None)
    host = f.register_host(token, gpus=(0, 1))
    gpu1 = Gpu.objects.get(host=host, index=1)
    supplier_services.set_gpu_terms(gpu1.pk, price_per_hour_micros=1_000_000, listed=False)
    assert _state(host, 0) == ("unlisted", "unlisted", "needs a price")
    assert _state(host, 1) == ("unlisted", "unlisted", "")


def test_a_gpu_the_agent_no_longer_reports_is_offline() -> None:
    host = f.register_host(gpus=(0, 1))
    Gpu.objects.filter(host=host, index=1).update(present=False)
    assert _state(host, 1)[0] == "offline"


def test_a_host_with_a_stuck_release_takes_no_rentals() -> None:
    host = f.register_host()
    Host.objects.filter(pk=host.pk).update(release_stuck_since=timezone.now())
    assert _state(host)[:2] == ("maintenance", "maintenance")


def test_a_released_gpu_is_listed_and_idle_again() -> None:
    host = f.register_host()
    lease = f.run_lease(host)
    lease_services.release_lease(lease.pk, Lease.EndReason.RENTER_STOP)
    f.ack(f.command_of(lease, "release"))
    assert _state(host)[0] == "listed"
