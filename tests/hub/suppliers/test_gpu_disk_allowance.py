"""Issue 33 item 1, the supplier's side: each GPU has a disk allowance (what one rental of it may
write on the host), a default from GPU_DISK_ALLOWANCE_DEFAULT_BYTES, set by its supplier within
1 GiB..100 TiB."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import override_settings

from hub.suppliers import services
from hub.suppliers.models import Gpu
from tests.hub import factories as f

pytestmark = pytest.mark.usefixtures("db")

GIB = 1 << 30
TIB = 1024 * GIB


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


def test_a_new_gpu_gets_the_default_allowance_of_50_gib() -> None:
    host = f.register_host(gpus=(0, 1))
    assert list(host.gpus.values_list("disk_allowance_bytes", flat=True)) == [50 * GIB] * 2


def test_the_default_comes_from_the_setting_and_a_known_gpu_keeps_its_own() -> None:
    token, _ = f.make_token()
    host = f.register_host(token, gpus=(0,))
    gpu = host.gpus.get()
    services.set_gpu_terms(gpu.pk, disk_allowance_bytes=200 * GIB)

    with override_settings(GPU_DISK_ALLOWANCE_DEFAULT_BYTES=20 * GIB):
        # The same agent registers again with a second GPU: only the new one gets the default.
        again = f.register_host(token, agent_id=str(host.agent_id), gpus=(0, 1))

    assert again.pk == host.pk
    assert dict(again.gpus.values_list("index", "disk_allowance_bytes")) == {
        0: 200 * GIB,
        1: 20 * GIB,
    }


def test_a_supplier_changes_the_allowance_alone() -> None:
    gpu = f.register_host().gpus.get()
    services.set_gpu_terms(gpu.pk, price_per_hour_micros=1_500_000)

    changed = services.set_gpu_terms(gpu.pk, disk_allowance_bytes=TIB)

    assert changed.disk_allowance_bytes == TIB
    row = Gpu.objects.get(pk=gpu.pk)
    assert (row.disk_allowance_bytes, row.price_per_hour_micros, row.listed) == (
        TIB,
        1_500_000,
        True,
    )


@pytest.mark.parametrize("allowance", [0, -GIB, GIB - 1, 100 * TIB + 1, 2**63 - 1])
def test_an_allowance_outside_1_gib_to_100_tib_is_refused_in_words(allowance: int) -> None:
    gpu = f.register_host().gpus.get()

    with pytest.raises(services.SupplierError) as refused:
        services.set_gpu_terms(gpu.pk, disk_allowance_bytes=allowance, price_per_hour_micros=7)

    assert str(refused.value) == ("a disk allowance must be between 1 GiB and 100 TiB (102400 GiB)")
    row = Gpu.objects.get(pk=gpu.pk)
    assert (row.disk_allowance_bytes, row.price_per_hour_micros) == (50 * GIB, 0)


@pytest.mark.parametrize("allowance", [GIB, 100 * TIB])
def test_the_bounds_themselves_are_allowed(allowance: int) -> None:
    gpu = f.register_host().gpus.get()
    assert services.set_gpu_terms(gpu.pk, disk_allowance_bytes=allowance).disk_allowance_bytes == (
        allowance
    )
