"""Issue 33 item 1 through the API: a supplier reads and sets their GPUs' terms (the disk
allowance in GiB, with the opt-in `hosts` scope), and renters see the allowance on offers and
on their leases."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from hub.accounts.models import User
from hub.leases.models import Lease
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Gpu, Host
from tests.hub import factories as f
from tests.hub.api.conftest import client_for

pytestmark = pytest.mark.django_db

GIB = 1 << 30
BOUNDS = "a disk allowance must be between 1 GiB and 100 TiB (102400 GiB)"


@pytest.fixture
def supplier() -> User:
    return f.make_user("supplier")


@pytest.fixture
def host(supplier: User) -> Host:
    return f.register_host(f.make_token(supplier)[0], gpus=(0, 1))


@pytest.fixture
def owner_api(supplier: User) -> APIClient:
    return client_for(supplier, ["read", "hosts"])


def _gpu(host: Host, index: int) -> Gpu:
    return host.gpus.get(index=index)


def test_a_supplier_lists_their_gpus_with_their_terms(owner_api: APIClient, host: Host) -> None:
    f.register_host()  # someone else's

    listed = owner_api.get("/api/v1/gpus/").json()

    assert [(g["host_id"], g["index"]) for g in listed] == [(host.pk, 0), (host.pk, 1)]
    assert listed[0]["disk_allowance_bytes"] == 50 * GIB
    assert listed[0]["disk_allowance"] == "50 GiB"
    assert listed[0]["price_per_hour"] == "$0.00"
    assert listed[0]["listed"] is True


def test_a_supplier_sets_the_disk_allowance_in_gib(owner_api: APIClient, host: Host) -> None:
    gpu = _gpu(host, 0)

    response = owner_api.patch(
        f"/api/v1/gpus/{gpu.pk}/", {"disk_allowance_gib": 200}, format="json"
    )

    assert response.status_code == 200, response.json()
    assert response.json()["disk_allowance_bytes"] == 200 * GIB
    assert response.json()["disk_allowance"] == "200 GiB"
    gpu.refresh_from_db()
    assert (gpu.disk_allowance_bytes, gpu.price_per_hour_micros, gpu.listed) == (
        200 * GIB,
        0,
        True,
    )


def test_price_and_listing_are_set_the_same_way(owner_api: APIClient, host: Host) -> None:
    gpu = _gpu(host, 1)

    body = owner_api.patch(
        f"/api/v1/gpus/{gpu.pk}/", {"price_per_hour": "1.25", "listed": False}, format="json"
    ).json()

    assert (body["price_per_hour_micros"], body["listed"]) == (1_250_000, False)
    assert body["disk_allowance_bytes"] == 50 * GIB


@pytest.mark.parametrize("gib", [0, -5, 102401, 10**12])
def test_an_allowance_out_of_bounds_is_400_in_words(
    owner_api: APIClient, host: Host, gib: int
) -> None:
    gpu = _gpu(host, 0)

    response = owner_api.patch(
        f"/api/v1/gpus/{gpu.pk}/", {"disk_allowance_gib": gib}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["detail"] == f"disk_allowance_gib: {BOUNDS}"
    gpu.refresh_from_db()
    assert gpu.disk_allowance_bytes == 50 * GIB


def test_a_price_above_the_limit_is_400_from_the_service(owner_api: APIClient, host: Host) -> None:
    gpu = _gpu(host, 0)

    response = owner_api.patch(
        f"/api/v1/gpus/{gpu.pk}/",
        {"price_per_hour": "1000.01", "disk_allowance_gib": 10},
        format="json",
    )

    assert response.status_code == 400
    assert response.json() == {"detail": "the price must be between $0 and $1,000 per hour"}
    gpu.refresh_from_db()
    assert gpu.disk_allowance_bytes == 50 * GIB


def test_setting_terms_needs_the_hosts_scope(supplier: User, host: Host) -> None:
    gpu = _gpu(host, 0)
    default = client_for(supplier)  # read and leases

    assert default.get(f"/api/v1/gpus/{gpu.pk}/").status_code == 200
    refused = default.patch(f"/api/v1/gpus/{gpu.pk}/", {"disk_allowance_gib": 9}, format="json")

    assert refused.status_code == 403
    assert "'hosts' scope" in refused.json()["detail"]
    gpu.refresh_from_db()
    assert gpu.disk_allowance_bytes == 50 * GIB


def test_another_suppliers_gpu_is_404(owner_api: APIClient) -> None:
    theirs = f.register_host().gpus.get()

    assert owner_api.get(f"/api/v1/gpus/{theirs.pk}/").status_code == 404
    patched = owner_api.patch(
        f"/api/v1/gpus/{theirs.pk}/", {"disk_allowance_gib": 9}, format="json"
    )

    assert patched.status_code == 404
    theirs.refresh_from_db()
    assert theirs.disk_allowance_bytes == 50 * GIB


# --- what renters see ----------------------------------------------------------------------------


def test_an_offer_shows_the_gpus_allowance_next_to_the_hosts_free_disk(
    api: APIClient, host: Host
) -> None:
    supplier_services.set_gpu_terms(_gpu(host, 1).pk, disk_allowance_bytes=120 * GIB)

    offers = {
        o["gpu_index"]: o for o in api.get("/api/v1/offers/").json() if o["host_id"] == host.pk
    }

    assert (offers[0]["disk_allowance_bytes"], offers[0]["disk_allowance"]) == (
        50 * GIB,
        "50 GiB",
    )
    assert (offers[1]["disk_allowance_bytes"], offers[1]["disk_allowance"]) == (
        120 * GIB,
        "120 GiB",
    )


def test_a_lease_shows_the_allowance_it_started_with(
    api: APIClient, renter: User, host: Host
) -> None:
    supplier_services.set_gpu_terms(_gpu(host, 0).pk, disk_allowance_bytes=10 * GIB)
    lease = f.start_lease(host, [0, 1], renter=renter)
    supplier_services.set_gpu_terms(_gpu(host, 0).pk, disk_allowance_bytes=500 * GIB)

    body = api.get(f"/api/v1/leases/{lease.pk}/").json()

    assert (body["disk_allowance_bytes"], body["disk_allowance"]) == (60 * GIB, "60 GiB")


def test_a_lease_from_before_allowances_shows_null(
    api: APIClient, renter: User, host: Host
) -> None:
    lease = f.start_lease(host, [0], renter=renter)
    Lease.objects.filter(pk=lease.pk).update(disk_allowance_bytes=None)

    body = api.get(f"/api/v1/leases/{lease.pk}/").json()

    assert (body["disk_allowance_bytes"], body["disk_allowance"]) == (None, "")
