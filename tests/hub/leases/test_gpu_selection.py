"""GPU selections (all, count=N, indices, NVML UUIDs) in one grammar for the CLI, the API and
the rent form, resolved against real hosts' GPUs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from hub.billing import services as billing
from hub.leases import gpu_choice
from hub.leases.models import Lease
from hub.leases.services import LeaseError
from hub.lib.gpu_select import FORMS, GpuSelection, InvalidGpuSelection, parse_gpu_selection
from hub.suppliers.models import Gpu, Host
from tests.hub import factories as f
from tests.hub.api.conftest import client_for

pytestmark = pytest.mark.django_db

UUID_0 = "GPU-00000000-0000-4000-8000-000000000000"
UUID_1 = "GPU-00000001-0000-4000-8000-000000000001"


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


def _host(*names: str, hostname: str = "rig-1") -> Host:
    gpus = [
        dataclasses.replace(f.gpu_state(i, gpu_uuid=f"GPU-{i:08x}-0000-4000-8000-{i:012x}"),
                            name=name)
        for i, name in enumerate(names)
    ]  # fmt: skip
    return f.register_host(gpus=gpus)


def _indices(lease: Lease) -> list[int]:
    return sorted(lease.lease_gpus.values_list("gpu__index", flat=True))


def _funded() -> Any:
    renter = f.make_user("renter")
    billing.adjust(renter, 50_000_000, "test top-up", f.make_user("admin", is_staff=True))
    return renter


def _start(selection: str, host: Host | None, model: str | None = None) -> Lease:
    return gpu_choice.start_lease_on(
        _funded(), parse_gpu_selection(selection), f.lease_spec(), host=host, model=model
    )


# --- the grammar --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("all", GpuSelection("all")),
        ("count=2", GpuSelection("count", count=2)),
        ("1", GpuSelection("indices", indices=(1,))),  # a bare number is an index
        ("0,3", GpuSelection("indices", indices=(0, 3))),
        ("device=0,1", GpuSelection("indices", indices=(0, 1))),
        (f"{UUID_0},{UUID_1}", GpuSelection("uuids", uuids=(UUID_0, UUID_1))),
    ],
)
def test_each_form_parses(text: str, expected: GpuSelection) -> None:
    assert parse_gpu_selection(text) == expected


@pytest.mark.parametrize(
    "text", ["", "count=0", "count=65", "two", "0,0", "64", "0,GPU-abc", "-1", "0;rm -rf /", "2x"]
)
def test_an_invalid_selection_names_the_forms(text: str) -> None:
    with pytest.raises(InvalidGpuSelection) as refused:
        parse_gpu_selection(text)
    assert FORMS in str(refused.value)


# --- on one host --------------------------------------------------------------------------------


def test_all_takes_every_gpu_of_the_host() -> None:
    host = _host("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")
    assert _indices(_start("all", host)) == [0, 1]


def test_a_count_takes_free_gpus_and_says_how_many_there_are() -> None:
    host = _host("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")
    assert _indices(_start("0", host)) == [0]
    assert _indices(_start("count=2", host)) == [1, 2]
    with pytest.raises(LeaseError, match="this host has 0 free GPU"):
        _start("count=1", host)


def test_uuids_name_gpus_by_nvml_uuid() -> None:
    host = _host("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")
    assert _indices(_start(UUID_1, host)) == [1]
    with pytest.raises(LeaseError, match="this host has no GPU GPU-00000009"):
        _start("GPU-00000009-0000-4000-8000-000000000009", host)


# --- across the market --------------------------------------------------------------------------


def test_a_count_of_a_model_without_a_host_takes_the_cheapest_host_that_has_them() -> None:
    small = _host("NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3")  # one 4090 only
    dear = _host("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")
    cheap = _host("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")
    Gpu.objects.filter(host=dear).update(price_per_hour_micros=900_000)
    Gpu.objects.filter(host=cheap).update(price_per_hour_micros=300_000)
    Gpu.objects.filter(host=small).update(price_per_hour_micros=1)
    lease = _start("count=2", None, model="RTX 4090")
    assert lease.host_id == cheap.pk
    assert len(_indices(lease)) == 2
    with pytest.raises(LeaseError, match="no online host has 3 free RTX 4090 GPU"):
        _start("count=3", None, model="RTX 4090")
    with pytest.raises(LeaseError, match="without a host, choose a count"):
        _start("all", None)


# --- the three ways in --------------------------------------------------------------------------


def test_the_cli_takes_a_selection_and_refuses_a_bad_one_with_the_forms() -> None:
    host = _host("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")
    renter = f.make_user("renter")
    common = ["--renter", renter.username, "--image", f.TEST_IMAGE, "--wait", "0"]
    call_command("hub", "lease", "start", "--gpus", "count=2", "--model", "4090", *common)
    assert _indices(Lease.objects.get(renter=renter)) == [0, 1]
    with pytest.raises(CommandError, match="is not a selection") as refused:
        call_command("hub", "lease", "start", "--host", str(host.pk), "--gpus", "2x", *common)
    assert "count=N (any N free GPUs" in str(refused.value)


def test_the_api_takes_a_selection_and_refuses_a_bad_one_with_the_forms() -> None:
    host = _host("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")
    api = client_for(f.make_user("renter"))
    body: dict[str, Any] = {"image": f.TEST_IMAGE}
    made = api.post("/api/v1/leases/", {"host_id": host.pk, "gpus": "all", **body}, format="json")
    assert made.status_code == 201, made.json()
    assert sorted(g["index"] for g in made.json()["gpus"]) == [0, 1]
    bad = api.post("/api/v1/leases/", {"host_id": host.pk, "gpus": "most", **body}, format="json")
    assert bad.status_code == 400
    assert FORMS in json_text(bad.json())


def json_text(value: Any) -> str:
    return value if isinstance(value, str) else " ".join(map(json_text, _values(value)))


def _values(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, list) else [str(value)]


def test_the_rent_form_takes_a_selection_of_the_gpu_s_host() -> None:
    host = _host("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090")
    renter = _funded()
    client = Client()
    client.force_login(renter)
    first = Gpu.objects.get(host=host, index=0)
    url = reverse("web:rent", args=[first.pk])
    fields = {"image": f.TEST_IMAGE, "seen_price_micros": str(first.price_per_hour_micros)}
    refused = client.post(url, {**fields, "gpus": "half"})
    assert refused.status_code == 400
    assert "count=N (any N free GPUs" in refused.content.decode()
    assert client.post(url, {**fields, "gpus": "count=2"}).status_code == 302
    assert _indices(Lease.objects.get(renter=renter)) == [0, 1]
