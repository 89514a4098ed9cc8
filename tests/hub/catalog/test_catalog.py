"""Templates, offers and uptime on the real database."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from hub.catalog import offers
from hub.catalog.models import Template
from hub.catalog.services import lease_spec
from hub.leases.services import LeaseError
from hub.suppliers.models import Gpu, Host, HostTransition
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

GIB = 1 << 30


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


def test_the_seeded_catalogue_has_the_four_templates() -> None:
    slugs = set(Template.objects.values_list("slug", flat=True))
    assert {"pytorch-jupyterlab", "vllm-openai", "comfyui", "ubuntu-ssh"} <= slugs
    for template in Template.objects.all():
        spec = lease_spec(template)  # every seeded template passes the protocol's checks
        assert spec.image == template.image


@pytest.mark.django_db(transaction=True)
def test_a_flush_like_a_transactional_test_s_leaves_the_seeded_catalogue() -> None:
    # pytest-django ends every transactional test with this flush; under xdist the tests that
    # read the catalogue may come after one on the same worker.
    call_command("flush", interactive=False, verbosity=0)
    slugs = set(Template.objects.values_list("slug", flat=True))
    assert {"pytorch-jupyterlab", "vllm-openai", "comfyui", "ubuntu-ssh"} <= slugs
    assert Template.objects.count() == len(slugs)  # seeded once, not again on top


def test_offers_are_free_listed_gpus_of_online_hosts_filtered_and_sorted() -> None:
    host = f.register_host(gpus=(f.gpu_state(0), f.gpu_state(1, memory_total_bytes=80 * GIB)))
    Gpu.objects.filter(host=host, index=0).update(price_per_hour_micros=500_000)
    Gpu.objects.filter(host=host, index=1).update(price_per_hour_micros=2_000_000)
    other = f.register_host(gpus=(0,))
    Gpu.objects.filter(host=other).update(listed=False)
    assert [o.gpu_index for o in offers.list_offers()] == [0, 1]
    assert [o.gpu_index for o in offers.list_offers(sort="-price")] == [1, 0]
    assert [o.gpu_index for o in offers.list_offers(min_vram_bytes=40 * GIB)] == [1]
    assert [o.gpu_index for o in offers.list_offers(max_price_micros=1_000_000)] == [0]
    assert offers.list_offers(model="H100") == []

    Gpu.objects.filter(host=host, index=0).update(price_per_hour_micros=0)  # no funds needed
    f.run_lease(host, [0])  # a leased GPU is not on offer
    assert [o.gpu_index for o in offers.list_offers()] == [1]
    Host.objects.filter(pk=host.pk).update(maintenance=True)
    assert offers.list_offers() == []


def test_uptime_is_the_online_share_of_the_last_seven_days() -> None:
    host = f.register_host(gpus=(0,))
    now = timezone.now()
    Host.objects.filter(pk=host.pk).update(created_at=now - timedelta(days=30))
    HostTransition.objects.filter(host=host).delete()
    for status, days_ago in (("online", 10), ("offline", 5), ("online", 4)):
        row = HostTransition.objects.create(host=host, from_status="", to_status=status)
        HostTransition.objects.filter(pk=row.pk).update(at=now - timedelta(days=days_ago))
    # Online from 7 days ago until 5 days ago, offline for a day, online since 4 days ago.
    assert offers.uptime([host.pk], now)[host.pk] == pytest.approx(6 / 7, abs=1e-6)


def test_a_new_host_is_judged_only_since_it_appeared() -> None:
    host = f.register_host(gpus=(0,))
    assert offers.uptime([host.pk])[host.pk] == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"image": "Not An Image!"}, "not a valid image reference"),
        ({"ports": [0]}, "port"),
        ({"ports": [8080, 8080]}, "twice"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "LD_PRELOAD"),
        ({"command": "rm -rf /"}, "list of strings"),
    ],
)
def test_bad_renter_input_is_a_clear_error(overrides: dict, message: str) -> None:
    template = Template.objects.get(slug="ubuntu-ssh")
    with pytest.raises(LeaseError, match=message):
        lease_spec(template, **overrides)


def test_a_template_s_cache_folder_becomes_a_named_volume_and_overrides_win() -> None:
    template = Template.objects.get(slug="pytorch-jupyterlab")
    spec = lease_spec(template, env={"EXTRA": "1"}, ports=[8888, 6006], access_protected=True)
    assert spec.cache_volume == {"name": "template-pytorch-jupyterlab", "path": "/root/.cache"}
    assert spec.env == {"JUPYTER_ENABLE_LAB": "yes", "EXTRA": "1"}
    assert spec.ports == [8888, 6006]
    assert spec.access_protected
    with pytest.raises(LeaseError, match="template or give an image"):
        lease_spec(None)
    assert lease_spec(None, image="busybox:latest").image == "busybox:latest"
