"""Issue 33 item 1 on the dashboard: a supplier sets each GPU's disk allowance next to its
price; renters see it on the offers and on their lease's page, and why the host stopped a
rental for its disk."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from hub.leases import services as lease_services
from hub.leases.models import Lease
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Gpu
from supplier_agent.protocol import ContainerExited
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

GIB = 1 << 30
BOUNDS = "a disk allowance must be between 1 GiB and 100 TiB (102400 GiB)"


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _terms(client: Client, gpu: Gpu, **fields: str) -> list[str]:
    """Post the GPU's row of the hosts page; the flash messages it answered with."""
    data = {f"gpu{gpu.pk}-{name}": value for name, value in fields.items()}
    response = client.post(reverse("web:gpu-terms", args=[gpu.pk]), data)
    assert response.status_code == 302
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_hosts_page_shows_each_gpus_allowance_in_gib() -> None:
    token, _ = f.make_token()
    gpu = f.register_host(token).gpus.get()

    page = _client(token.owner).get(reverse("web:hosts")).content.decode()

    assert f'name="gpu{gpu.pk}-disk_allowance_gib" value="50"' in page


def test_a_supplier_sets_the_allowance_with_the_price() -> None:
    token, _ = f.make_token()
    gpu = f.register_host(token).gpus.get()

    said = _terms(_client(token.owner), gpu, price="1.5", listed="on", disk_allowance_gib="80")

    gpu.refresh_from_db()
    assert (gpu.disk_allowance_bytes, gpu.price_per_hour_micros, gpu.listed) == (
        80 * GIB,
        1_500_000,
        True,
    )
    assert any("80 GiB of disk per rental" in m for m in said), said


def test_the_allowance_posted_back_as_shown_stays_as_it_was() -> None:
    # A default that is not a whole number of GiB shows rounded down; saving the price must
    # not round the allowance with it.
    token, _ = f.make_token()
    gpu = f.register_host(token).gpus.get()
    Gpu.objects.filter(pk=gpu.pk).update(disk_allowance_bytes=50 * GIB + GIB // 2)

    _terms(_client(token.owner), gpu, price="2", listed="on", disk_allowance_gib="50")

    gpu.refresh_from_db()
    assert (gpu.disk_allowance_bytes, gpu.price_per_hour_micros) == (50 * GIB + GIB // 2, 2_000_000)


@pytest.mark.parametrize(
    ("value", "words"), [("0", BOUNDS), ("102401", BOUNDS), ("lots", "Enter a whole number.")]
)
def test_a_bad_allowance_is_refused_in_words_and_nothing_changes(value: str, words: str) -> None:
    token, _ = f.make_token()
    gpu = f.register_host(token).gpus.get()

    said = _terms(_client(token.owner), gpu, price="3", listed="on", disk_allowance_gib=value)

    assert any(words in m and "unchanged" in m for m in said), said
    gpu.refresh_from_db()
    assert (gpu.disk_allowance_bytes, gpu.price_per_hour_micros) == (50 * GIB, 0)


def test_the_offers_page_shows_the_allowance() -> None:
    gpu = f.register_host().gpus.get()
    supplier_services.set_gpu_terms(gpu.pk, disk_allowance_bytes=120 * GIB)

    page = _client(f.make_user("renter")).get(reverse("web:offers")).content.decode()

    row = page.split(f'data-gpu="{gpu.pk}"', 1)[1].split("</tr>", 1)[0]
    assert '<td class="num offer-disk">120 GiB</td>' in row


def test_the_lease_page_shows_its_disk_and_why_the_host_stopped_it() -> None:
    host = f.register_host(gpus=(0, 1))
    renter = f.make_user("renter")
    lease = f.run_lease(host, [0, 1], renter=renter)
    client = _client(renter)

    panel = client.get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert '<dd id="lease-disk">100 GiB' in panel

    reason = "Stopped: this rental wrote 101 GiB, over its disk allowance of 100 GiB."
    lease_services.record_container_exit(
        host.pk,
        ContainerExited(
            lease_id=str(lease.id), exit_code=137, stop_cause="disk_allowance", stop_reason=reason
        ),
    )
    Lease.objects.filter(pk=lease.pk).update(state=Lease.State.ENDED)  # as after the release

    panel = client.get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert "The host stopped it for its disk use" in panel
    assert reason in panel
