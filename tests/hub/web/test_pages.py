"""Dashboard pages through Django's test client on the real database: who sees what, CSRF,
the login rate limit, renting with plain-word errors."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.sessions.models import Session
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from hub.agents import heartbeats
from hub.billing import services as billing
from hub.catalog.models import Template
from hub.leases import gpu_faults
from hub.leases.models import Lease
from hub.suppliers import services as supplier_services
from hub.suppliers.models import AgentToken, Gpu
from hub.web import ratelimit
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

PASSWORD = "correct-Horse-battery-9"


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _priced_host(price_micros: int = 1_000_000) -> Any:
    host = f.register_host(gpus=(0,))
    supplier_services.set_gpu_terms(host.gpus.get().pk, price_per_hour_micros=price_micros)
    return host


def _funded_renter(amount_micros: int = 50_000_000) -> Any:
    renter = f.make_user("renter")
    admin = f.make_user("admin", is_staff=True)
    billing.adjust(renter, amount_micros, "test top-up", admin)
    return renter


def test_signup_logs_the_new_person_in() -> None:
    client = Client()
    name = f"new-{uuid.uuid4().hex[:6]}"
    response = client.post(
        reverse("web:signup"),
        {"username": name, "password1": PASSWORD, "password2": PASSWORD},
        follow=True,
    )
    assert response.status_code == 200
    assert response.context["user"].username == name


def test_login_is_rate_limited_per_username_and_address(settings: Any) -> None:
    user = f.make_user("victim")
    user.set_password(PASSWORD)
    user.save()
    ratelimit.clear(user.username, "127.0.0.1")
    client = Client()
    for _ in range(settings.LOGIN_RATE_LIMIT):
        response = client.post(reverse("web:login"), {"username": user.username, "password": "x"})
        assert response.status_code == 200
    response = client.post(reverse("web:login"), {"username": user.username, "password": PASSWORD})
    assert response.status_code == 429
    assert "Too many failed log-in attempts" in response.content.decode()
    # Another address is not blocked.
    other = Client(REMOTE_ADDR="10.0.0.9")
    response = other.post(reverse("web:login"), {"username": user.username, "password": PASSWORD})
    assert response.status_code == 302
    ratelimit.clear(user.username, "127.0.0.1")
    cache.close()


def _seen(fields: dict[str, object], gpu_id: int) -> dict[str, object]:
    """A rent form's fields with the price its page showed, as the browser sends them."""
    price = Gpu.objects.get(pk=gpu_id).price_per_hour_micros
    return {**fields, "seen_price_micros": str(price)}


def test_forms_need_a_csrf_token() -> None:
    host = _priced_host()
    renter = _funded_renter()
    client = Client(enforce_csrf_checks=True)
    client.force_login(renter)
    gpu = host.gpus.get()
    response = client.post(reverse("web:rent", args=[gpu.pk]), _seen({"image": "busybox"}, gpu.pk))
    assert response.status_code == 403
    lease = f.start_lease(host, renter=renter)
    assert client.post(reverse("web:lease-stop", args=[lease.pk])).status_code == 403
    assert client.post(reverse("web:tokens"), {"name": "x"}).status_code == 403
    assert not Lease.objects.filter(state=Lease.State.STOPPING).exists()


def test_offers_list_free_gpus_with_filters_and_a_partial_for_htmx() -> None:
    cheap = _priced_host(500_000)
    _priced_host(3_000_000)
    client = Client()
    page = client.get(reverse("web:offers")).content.decode()
    assert "$0.50" in page
    assert "$3.00" in page
    assert "24 GiB" in page
    partial = client.get(
        reverse("web:offers"), {"max_price": "1", "sort": "-price"}, HTTP_HX_REQUEST="true"
    )
    body = partial.content.decode()
    assert "<html" not in body
    assert f'data-gpu="{cheap.gpus.get().pk}"' in body
    assert "$3.00" not in body


def test_renting_with_a_template_opens_the_lease_page_with_the_access_token_once() -> None:
    host = _priced_host()
    renter = _funded_renter()
    template = Template.objects.create(slug="t", name="T", image="busybox", ports=[8080])
    client = _client(renter)
    response = client.post(
        reverse("web:rent", args=[host.gpus.get().pk]),
        _seen(
            {"template": template.pk, "keep_alive_hours": "3", "access_protected": "on"},
            host.gpus.get().pk,
        ),
    )
    lease = Lease.objects.get(renter=renter)
    assert response.status_code == 302
    assert response["Location"] == reverse("web:lease", args=[lease.pk])
    assert lease.ports == [8080]
    assert lease.access_protected
    assert lease.stop_at is not None
    first = client.get(response["Location"]).content.decode()
    assert "cgpa_" not in first  # tokens are never kept to show later (issue 14)
    assert "Create an access token" in first
    assert "shown live below" in first
    assert f'data-live-logs="{lease.pk}"' in first  # live.js follows this lease's output
    issued = client.post(reverse("web:lease-access-token", args=[lease.pk])).content.decode()
    assert "cgpa_" in issued
    assert "cgpa_" not in client.get(response["Location"]).content.decode()


def test_no_plaintext_token_ever_reaches_the_session_store() -> None:
    supplier, renter = f.make_user("supplier"), _funded_renter()
    host = _priced_host()
    template = Template.objects.create(slug="p", name="P", image="busybox", ports=[8080])
    supplier_client, renter_client = _client(supplier), _client(renter)

    agent = supplier_client.post(reverse("web:tokens"), {"name": "rig"}).content.decode()
    api = renter_client.post(
        reverse("web:api-tokens"), {"name": "ci", "scopes": ["read", "leases"]}
    ).content.decode()
    renter_client.post(
        reverse("web:rent", args=[host.gpus.get().pk]),
        _seen({"template": template.pk, "access_protected": "on"}, host.gpus.get().pk),
    )
    lease = Lease.objects.get(renter=renter)
    access_page = renter_client.post(reverse("web:lease-access-token", args=[lease.pk]))

    # Each was shown in the response that made it...
    assert "cgpu_" in agent
    assert "cgpr_" in api
    assert "cgpa_" in access_page.content.decode()
    assert "no-store" in access_page["Cache-Control"]
    # ...and none of them is in any session.
    stored = " ".join(str(s.get_decoded()) for s in Session.objects.all())
    for prefix in ("cgpu_", "cgpr_", "cgpa_"):
        assert prefix not in stored


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"image": "bad image!"}, "image"),
        ({"image": "busybox", "ports": "70000"}, "port"),
        ({"image": "busybox", "ports": "eighty"}, "not a port number"),
    ],
)
def test_bad_rent_input_is_refused_in_plain_words_with_the_form_kept(
    fields: dict[str, str], words: str
) -> None:
    host = _priced_host()
    client = _client(_funded_renter())
    response = client.post(
        reverse("web:rent", args=[host.gpus.get().pk]), _seen(fields, host.gpus.get().pk)
    )
    assert response.status_code == 400
    body = response.content.decode()
    assert words in body.lower()
    assert f'value="{fields["image"]}"' in body
    assert not Lease.objects.exists()


def test_renting_without_funds_or_a_taken_gpu_says_so() -> None:
    host = _priced_host()
    gpu = host.gpus.get()
    broke = _client(f.make_user("broke"))
    response = broke.post(reverse("web:rent", args=[gpu.pk]), _seen({"image": "busybox"}, gpu.pk))
    assert response.status_code == 400
    assert "balance" in response.content.decode().lower()
    f.start_lease(host, renter=_funded_renter())
    response = _client(_funded_renter()).post(
        reverse("web:rent", args=[gpu.pk]), _seen({"image": "busybox"}, gpu.pk)
    )
    assert response.status_code == 400
    assert "just rented by someone else" in response.content.decode()


def test_a_renter_gets_404_on_another_renters_lease() -> None:
    host = _priced_host()
    owner = _funded_renter()
    lease = f.start_lease(host, renter=owner)
    other = _client(f.make_user("other"))
    for name in ("web:lease", "web:lease-panel"):
        assert other.get(reverse(name, args=[lease.pk])).status_code == 404
    assert other.post(reverse("web:lease-stop", args=[lease.pk])).status_code == 404
    lease.refresh_from_db()
    assert lease.active
    assert _client(owner).get(reverse("web:lease", args=[lease.pk])).status_code == 200


def test_stop_releases_the_lease() -> None:
    host = _priced_host()
    renter = _funded_renter()
    lease = f.start_lease(host, renter=renter)
    response = _client(renter).post(reverse("web:lease-stop", args=[lease.pk]))
    assert response.status_code == 302
    lease.refresh_from_db()
    assert lease.state == Lease.State.STOPPING
    assert lease.end_reason == Lease.EndReason.RENTER_STOP


@pytest.mark.parametrize(
    ("reason", "exit_code", "words"),
    [
        ("no_funds", None, "Your balance ran out (out of funds)"),
        ("host_lost", None, "The host went away"),
        ("exited", 137, "The container exited on its own with exit code 137."),
        ("out_of_memory", 137, "It ran out of memory"),
        ("expired", None, "keep-alive limit"),
    ],
)
def test_a_lease_page_says_why_it_ended_in_words(
    reason: str, exit_code: int | None, words: str
) -> None:
    renter = _funded_renter()
    lease = f.start_lease(_priced_host(), renter=renter)
    Lease.objects.filter(pk=lease.pk).update(
        state=Lease.State.ENDED, end_reason=reason, exit_code=exit_code
    )
    page = _client(renter).get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert words in page


def test_pages_need_login() -> None:
    client = Client()
    for name in ("web:leases", "web:usage", "web:hosts", "web:tokens", "web:earnings"):
        response = client.get(reverse(name))
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("web:login"))


def test_token_is_shown_once_never_on_a_command_line_and_can_be_revoked() -> None:
    supplier = f.make_user("supplier")
    client = _client(supplier)
    response = client.post(reverse("web:tokens"), {"name": "rig-9"}, follow=True)
    body = response.content.decode()
    token = AgentToken.objects.get(owner=supplier)
    assert token.prefix in body
    assert 'id="token-value"' in body
    assert "bash -s cgpu_" not in body
    assert 'id="token-value"' not in client.get(reverse("web:tokens")).content.decode()
    client.post(reverse("web:token-revoke", args=[token.pk]))
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_a_supplier_sees_and_edits_only_their_own_hosts_gpus_and_tokens() -> None:
    token_x, _ = f.make_token(name="x")
    host_x = f.register_host(token_x)
    token_y, _ = f.make_token(name="y")
    host_y = f.register_host(token_y)
    gpu_y = host_y.gpus.get()
    x = _client(token_x.owner)
    page = x.get(reverse("web:hosts")).content.decode()
    assert f'data-host="{host_x.pk}"' in page
    assert f'data-host="{host_y.pk}"' not in page
    response = x.post(
        reverse("web:gpu-terms", args=[gpu_y.pk]),
        {f"gpu{gpu_y.pk}-price": "9", f"gpu{gpu_y.pk}-listed": "on"},
    )
    assert response.status_code == 404
    assert x.get(reverse("web:host-status", args=[host_y.pk])).status_code == 404
    assert (
        x.post(reverse("web:host-maintenance", args=[host_y.pk]), {"maintenance": "on"}).status_code
        == 404
    )
    assert x.post(reverse("web:token-revoke", args=[token_y.pk])).status_code == 404
    token_y.refresh_from_db()
    host_y.refresh_from_db()
    assert token_y.revoked_at is None
    assert not host_y.maintenance
    assert Gpu.objects.get(pk=gpu_y.pk).price_per_hour_micros == 0


def test_a_supplier_sets_a_price_unlists_and_puts_a_host_into_maintenance() -> None:
    token, _ = f.make_token()
    host = f.register_host(token)
    gpu = host.gpus.get()
    client = _client(token.owner)
    client.post(reverse("web:gpu-terms", args=[gpu.pk]), {f"gpu{gpu.pk}-price": "1.25"})
    gpu.refresh_from_db()
    assert gpu.price_per_hour_micros == 1_250_000
    assert not gpu.listed
    client.post(reverse("web:host-maintenance", args=[host.pk]), {"maintenance": "on"})
    host.refresh_from_db()
    assert host.maintenance
    page = client.get(reverse("web:hosts")).content.decode()
    assert "End maintenance" in page
    assert "maintenance" in page


def test_heartbeat_stats_write_sparkline_samples() -> None:
    token, _ = f.make_token()
    host = f.register_host(token)
    heartbeats.write_heartbeat_stats(
        host.pk, f.heartbeat([f.gpu_state(0, utilization_pct=80, memory_used_bytes=8 * f.GIB)])
    )
    sample = host.gpus.get().samples.get()
    assert sample.utilization_pct == 80
    page = _client(token.owner).get(reverse("web:hosts")).content.decode()
    assert '<svg class="spark"' in page


def test_a_failed_gpu_shows_its_supplier_why_and_how_and_flags_the_renters_lease() -> None:
    token, _ = f.make_token()
    host = f.register_host(token)
    renter = _funded_renter()
    lease = f.start_lease(host, renter=renter)
    gpu = host.gpus.get()
    fault = gpu_faults.Fault(gpu.index, gpu.uuid, "xid", "the driver reported XID 79")
    assert gpu_faults.delist_failed_gpus(host.pk, [fault]) == [gpu.index]
    supplier_page = _client(token.owner).get(reverse("web:hosts")).content.decode()
    assert "the driver reported XID 79" in supplier_page
    assert "restart cloudgpu-agent, then put the GPU up for rent again" in supplier_page
    assert "failed" in supplier_page
    panel = _client(renter).get(reverse("web:lease-panel", args=[lease.pk])).content.decode()
    assert 'id="gpu-fault"' in panel
    assert "GPU 0 of this rental failed: the driver reported XID 79." in panel
