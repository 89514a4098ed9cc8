"""Issue 20 items 2 and 3: offers name their host (name and short id) and carry the details
renters choose by (CPU, RAM, free disk, driver and CUDA, location, uptime, round trip), each
filterable, as the agent reported them and the supplier set them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator

import pytest
from rest_framework.test import APIClient

from hub.accounts.models import User
from hub.agents import registration
from hub.catalog.uptime import refresh_uptimes
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Host
from supplier_agent.protocol import ProtocolError, Register, encode, parse_message
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

GIB = 1 << 30


def _host(
    *,
    hostname: str = "vm",
    ram_gib: int = 128,
    cpus: int = 32,
    disk_gib: int | None = 500,
    cuda: str = "12.4",
    location: str = "",
) -> Host:
    token, _ = f.make_token()
    message = dataclasses.replace(
        f.register_message(hostname=hostname),
        ram_bytes=ram_gib * GIB,
        cpu_count=cpus,
        disk_free_bytes=None if disk_gib is None else disk_gib * GIB,
        driver_version="550.54.15",
        cuda_version=cuda,
    )
    registered = registration.register_host(token.pk, message, "")
    host = Host.objects.get(pk=registered.host_id)
    if location:
        host = supplier_services.set_host_details(host.pk, name="", location=location)
    return host


@pytest.fixture
def hosts() -> Iterator[tuple[Host, Host]]:
    small = _host(ram_gib=32, cpus=8, disk_gib=50, cuda="11.8", location="DE")
    big = _host(ram_gib=256, cpus=64, disk_gib=2000, cuda="12.10", location="US-East")
    return small, big


def _offer_hosts(api: APIClient, query: str = "") -> list[int]:
    response = api.get(f"/api/v1/offers/{query}")
    assert response.status_code == 200, response.json()
    return [offer["host_id"] for offer in response.json()]


def test_an_offer_carries_what_the_agent_reported_and_the_supplier_set(
    api: APIClient, hosts: tuple[Host, Host]
) -> None:
    small, _ = hosts
    supplier_services.record_rtt(small.pk, 23)
    offer = next(o for o in api.get("/api/v1/offers/").json() if o["host_id"] == small.pk)
    assert offer["host_name"] == "vm"
    assert offer["host_short_id"] == small.agent_id.hex[:6]
    assert offer["location"] == "DE"
    assert offer["cpu_model"] == "AMD EPYC 7543"
    assert offer["cpu_count"] == 8
    assert offer["ram_bytes"] == 32 * GIB
    assert offer["disk_free_bytes"] == 50 * GIB
    assert offer["driver_version"] == "550.54.15"
    assert offer["cuda_version"] == "11.8"
    assert offer["rtt_ms"] == 23
    assert 0.0 <= offer["uptime_7d"] <= 1.0


@pytest.mark.parametrize(
    ("query", "which"),
    [
        ("?location=us", "big"),
        ("?location=de", "small"),
        ("?min_cpus=16", "big"),
        ("?min_ram_gib=64", "big"),
        ("?min_disk_gib=100", "big"),
        # 12.10 is newer than 12.4, and 11.8 is older: versions compare as numbers.
        ("?min_cuda=12.4", "big"),
        ("?min_cuda=11", "both"),
        ("?location=mars", "none"),
    ],
)
def test_offers_filter_on_host_details(
    api: APIClient, hosts: tuple[Host, Host], query: str, which: str
) -> None:
    small, big = hosts
    expected = {"small": {small.pk}, "big": {big.pk}, "both": {small.pk, big.pk}, "none": set()}
    assert set(_offer_hosts(api, query)) == expected[which]


def test_offers_filter_on_the_measured_round_trip(api: APIClient, hosts: tuple[Host, Host]) -> None:
    small, big = hosts
    supplier_services.record_rtt(small.pk, 20)
    supplier_services.record_rtt(big.pk, 180)
    assert _offer_hosts(api, "?max_rtt_ms=50") == [small.pk]


def test_offers_filter_on_the_measured_uptime(api: APIClient, hosts: tuple[Host, Host]) -> None:
    small, big = hosts
    f.take_offline(small)
    # Back online: its 7 days so far hold an outage, the other host's none.
    registration.register_host(
        small.token_id,
        dataclasses.replace(f.register_message(str(small.agent_id)), cpu_count=8),
        "",
    )
    # Offers read each host's uptime as the beat last wrote it (hub/catalog/uptime.py).
    assert refresh_uptimes() >= 1
    assert set(_offer_hosts(api, "?min_uptime_pct=0")) == {small.pk, big.pk}
    offers = {o["host_id"]: o["uptime_7d"] for o in api.get("/api/v1/offers/").json()}
    assert offers[big.pk] == 1.0
    assert offers[small.pk] < 1.0
    assert _offer_hosts(api, "?min_uptime_pct=100") == [big.pk]


@pytest.mark.parametrize(
    "query", ["?min_cuda=twelve", "?min_ram_gib=-1", "?max_rtt_ms=-5", "?min_uptime_pct=101"]
)
def test_bad_host_filters_are_400(api: APIClient, query: str) -> None:
    response = api.get(f"/api/v1/offers/{query}")
    assert response.status_code == 400
    assert response.json()["detail"]


def test_an_older_agent_s_register_leaves_the_details_unknown(api: APIClient) -> None:
    host = f.register_host()
    host.refresh_from_db()
    assert host.disk_free_bytes is None
    assert host.driver_version == ""
    offer = next(o for o in api.get("/api/v1/offers/").json() if o["host_id"] == host.pk)
    assert offer["disk_free_bytes"] is None
    assert offer["cuda_version"] == ""


def test_register_sends_the_new_fields_only_when_measured() -> None:
    """Backward compatible both ways: an unmeasured field stays out of the frame (an older hub
    would refuse it as unknown), and a frame without them parses as before."""
    plain = f.register_message()
    assert "disk_free_bytes" not in plain.to_dict()
    assert "cuda_version" not in plain.to_dict()
    measured = dataclasses.replace(plain, disk_free_bytes=7, cuda_version="12.4")
    body = measured.to_dict()
    assert body["disk_free_bytes"] == 7
    parsed = parse_message(encode(measured))
    assert isinstance(parsed, Register)
    assert parsed.disk_free_bytes == 7
    assert parsed.cuda_version == "12.4"
    assert parse_message(encode(plain)) == plain
    with pytest.raises(ProtocolError, match="disk_free_bytes"):
        parse_message(json.dumps({**body, "disk_free_bytes": -1}))
    with pytest.raises(ProtocolError, match="cuda_version"):
        parse_message(json.dumps({**body, "cuda_version": "x" * 17}))


def test_two_hosts_named_alike_are_told_apart_and_the_supplier_names_them() -> None:
    first, second = _host(hostname="vm"), _host(hostname="vm")
    assert first.label != second.label
    assert first.label == f"vm · {first.agent_id.hex[:6]}"
    renamed = supplier_services.set_host_details(first.pk, name="  rack 3  box  ", location=" DE ")
    assert renamed.label == f"rack 3 box · {first.agent_id.hex[:6]}"
    assert renamed.location == "DE"
    with pytest.raises(supplier_services.SupplierError):
        supplier_services.set_host_details(first.pk, name="a\x00b", location="")
    with pytest.raises(supplier_services.SupplierError):
        supplier_services.set_host_details(first.pk, name="n" * 65, location="")


def test_a_lease_names_its_host_as_pages_do(api: APIClient, renter: User) -> None:
    host = supplier_services.set_host_details(_host().pk, name="rack-7", location="")
    lease = f.start_lease(host, renter=renter)
    body = api.get(f"/api/v1/leases/{lease.pk}/").json()
    assert body["host_label"] == f"rack-7 · {host.agent_id.hex[:6]}"
    assert body["hostname"] == "vm"
