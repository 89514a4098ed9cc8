"""Issue 20 through Django's test client: what the pages say to a newcomer (the browser tests in
tests/web/test_newcomer_browser.py watch the same things live)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from hub.catalog.models import Template
from hub.leases import logs as lease_logs
from hub.leases.models import Lease
from hub.suppliers import liveness
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def own_redis_keys() -> Iterator[str]:
    with f.private_redis_keys() as prefix:
        yield prefix


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _ended(lease: Lease, **fields: Any) -> None:
    Lease.objects.filter(pk=lease.pk).update(
        state=Lease.State.ENDED, ended_at=timezone.now(), **fields
    )


# --- item 1: one true state per GPU, times that count -----------------------------------------


def test_the_hosts_page_says_rented_for_a_rented_gpu_and_counts_time_live() -> None:
    host = f.register_host(gpus=(0, 1))
    f.run_lease(host, [0])
    page = _client(host.owner).get(reverse("web:hosts")).content.decode()
    assert 'data-state="rented"' in page
    assert 'data-state="listed"' in page
    assert "for rent</span>" not in page  # the old label, true or not
    assert 'Uptime (7 days)</dt><dd class="host-uptime">100.0 %' in page
    # A <time> the page's script counts on from, not a frozen "0 minutes ago".
    assert f'data-since="{host.last_seen_at.isoformat()}"' in page


def test_a_sub_cent_price_is_shown_in_full_on_the_hosts_page_not_as_zero() -> None:
    host = f.register_host()
    gpu = host.gpus.get()
    supplier_services.set_gpu_terms(gpu.pk, price_per_hour_micros=4_000)  # $0.004 an hour
    page = _client(host.owner).get(reverse("web:hosts")).content.decode()
    assert f'name="gpu{gpu.pk}-price" value="0.004"' in page


def test_a_gpu_in_maintenance_does_not_say_listed() -> None:
    host = f.register_host()
    supplier_services.set_host_maintenance(host.pk, True)
    page = _client(host.owner).get(reverse("web:host-status", args=[host.pk])).content.decode()
    assert 'data-state="maintenance"' in page
    assert 'data-state="listed"' not in page


# --- item 2: named hosts --------------------------------------------------------------------


def test_a_supplier_names_a_host_and_every_page_shows_name_and_short_id() -> None:
    host = f.register_host()
    owner = _client(host.owner)
    response = owner.post(
        reverse("web:host-details", args=[host.pk]), {"name": "rack-3", "location": "DE"}
    )
    assert response.status_code == 302
    host.refresh_from_db()
    label = f"rack-3 · {host.agent_id.hex[:6]}"
    assert host.label == label
    assert label in owner.get(reverse("web:hosts"), follow=True).content.decode()
    hosts_page = owner.get(reverse("web:hosts")).content.decode()
    assert "rack-3" in hosts_page
    assert host.agent_id.hex[:6] in hosts_page
    offers = Client().get(reverse("web:offers")).content.decode()
    assert label in offers
    assert "DE" in offers
    renter = f.make_user("renter")
    lease = f.start_lease(host, renter=renter)
    assert label in _client(renter).get(reverse("web:lease", args=[lease.pk])).content.decode()
    admin = get_user_model().objects.create_superuser(f"admin-{host.pk}", password=None)
    admin_page = _client(admin).get("/admin/suppliers/host/").content.decode()
    assert label in admin_page


def test_another_supplier_cannot_rename_a_host() -> None:
    host = f.register_host()
    other = _client(f.make_user("other"))
    response = other.post(reverse("web:host-details", args=[host.pk]), {"name": "mine"})
    assert response.status_code == 404
    host.refresh_from_db()
    assert host.name == ""


def test_a_name_that_cannot_be_shown_is_refused_in_words() -> None:
    host = f.register_host()
    response = _client(host.owner).post(
        reverse("web:host-details", args=[host.pk]), {"name": "bad\x07bell"}, follow=True
    )
    assert "cannot be shown" in response.content.decode()
    assert Host.objects.get(pk=host.pk).name == ""


# --- item 5: the template fills the form; Stop asks first -----------------------------------


def test_the_rent_page_carries_each_template_s_fill_and_stop_asks_first() -> None:
    Template.objects.create(
        slug="fill-demo",
        name="Fill demo",
        image="busybox:1.36",
        ports=[8080, 7860],
        env={"MODE": "demo"},
        command=["httpd", "-f", "-p", "8080"],
        warmup=["sh", "-c", "sleep 1"],
    )
    host = f.register_host()
    renter = f.make_user("renter")
    page = _client(renter).get(reverse("web:rent", args=[host.gpus.get().pk])).content.decode()
    start = page.index('id="template-fills"')
    fills = json.loads(page[page.index(">", start) + 1 : page.index("</script>", start)])
    fill = next(v for v in fills.values() if v["image"] == "busybox:1.36")
    assert fill == {
        "image": "busybox:1.36",
        "ports": "8080, 7860",
        "env": "MODE=demo",
        "command": "httpd -f -p 8080",
        "warmup": "sh -c 'sleep 1'",
    }
    lease = f.start_lease(host, renter=renter)
    panel = _client(renter).get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert 'data-confirm="Stop this rental?' in panel


# --- item 6: an ended rental's page tells the truth ------------------------------------------


def test_an_ended_rental_shows_its_kept_output_not_no_output_and_not_cost_so_far() -> None:
    renter = f.make_user("renter")
    host = f.register_host()
    lease = f.start_lease(host, renter=renter)
    liveness.sync_client().rpush(
        lease_logs.backlog_key(str(lease.pk)),
        json.dumps({"seq": 1, "data": "line 1\nline 2\n"}),
    )
    _ended(lease, end_reason=Lease.EndReason.RENTER_STOP, running_since=timezone.now())
    panel = _client(renter).get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert "left no output" not in panel
    assert "line 1\nline 2" in panel
    assert "Cost so far" not in panel
    assert "<dt>Cost</dt>" in panel


def test_a_stopped_rental_without_kept_output_says_why_there_is_none() -> None:
    renter = f.make_user("renter")
    lease = f.start_lease(f.register_host(), renter=renter)
    _ended(lease, end_reason=Lease.EndReason.RENTER_STOP, running_since=timezone.now())
    panel = _client(renter).get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert "No output is kept for this rental" in panel
    assert "left no output" not in panel


def test_an_exited_rental_shows_its_exit_lines() -> None:
    renter = f.make_user("renter")
    lease = f.start_lease(f.register_host(), renter=renter)
    _ended(lease, end_reason=Lease.EndReason.EXITED, exit_code=1, log_tail="boom\n")
    panel = _client(renter).get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert "before it exited" in panel
    assert "boom" in panel


def test_a_running_rental_still_says_cost_so_far() -> None:
    renter = f.make_user("renter")
    lease = f.run_lease(f.register_host())
    Lease.objects.filter(pk=lease.pk).update(renter=renter)
    panel = _client(renter).get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert "Cost so far" in panel


# --- item 9: the admin ------------------------------------------------------------------------


def test_the_admin_is_cloudgpu_s_and_links_the_fleet_page() -> None:
    admin = get_user_model().objects.create_superuser("fleet-admin", password=None)
    page = _client(admin).get("/admin/").content.decode()
    assert "CloudGPU admin" in page
    assert "Django administration" not in page
    assert f'href="{reverse("fleet:fleet")}"' in page
