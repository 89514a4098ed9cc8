"""The notifications page (low-balance threshold, email choices, webhook endpoints and their
delivery logs) and the unsubscribe page an email links to."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from hub.accounts.models import User
from hub.notifications import emails, endpoints
from hub.notifications.kinds import KINDS, TEST_KIND
from hub.notifications.models import (
    Event,
    NotificationSettings,
    WebhookDelivery,
    WebhookEndpoint,
)
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.example.net/cloudgpu"


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _page(client: Client) -> str:
    response = client.get(reverse("web:notifications"))
    assert response.status_code == 200
    return response.content.decode()


# --- low balance ---


@override_settings(NOTIFY_LOW_BALANCE_DEFAULT_MICROS=7_500_000)
def test_the_page_is_in_the_nav_and_shows_the_default_threshold() -> None:
    assert reverse("web:notifications") == emails.SETTINGS_PATH  # where the emails link
    client = _client(f.make_user("renter"))
    assert (
        f'href="{reverse("web:notifications")}"'
        in client.get(reverse("web:offers")).content.decode()
    )
    assert 'value="7.50"' in _page(client)


def test_a_threshold_is_saved_in_micros_and_blank_turns_it_off() -> None:
    renter = f.make_user("renter")
    client = _client(renter)
    saved = client.post(reverse("web:notifications-low-balance"), {"threshold": "$12.34"})
    assert saved.status_code == 302
    assert NotificationSettings.objects.get(user=renter).low_balance_threshold_micros == 12_340_000
    assert 'value="12.34"' in _page(client)
    client.post(reverse("web:notifications-low-balance"), {"threshold": ""})
    assert NotificationSettings.objects.get(user=renter).low_balance_threshold_micros is None


@pytest.mark.parametrize(
    ("typed", "error"),
    [
        ("-1", "cannot be negative"),
        ("1.234", "at most 2 decimals"),
        ("1000000.01", "at most $1,000,000"),
        ("lots", "Enter an amount in dollars"),
        ("NaN", "Enter an amount in dollars"),
    ],
)
def test_a_bad_threshold_is_refused_with_a_reason(typed: str, error: str) -> None:
    renter = f.make_user("renter")
    refused = _client(renter).post(reverse("web:notifications-low-balance"), {"threshold": typed})
    assert refused.status_code == 400
    assert error in refused.content.decode()
    assert not NotificationSettings.objects.filter(user=renter).exists()


# --- email ---


def test_email_choices_are_stored_as_the_muted_kinds() -> None:
    renter = f.make_user("renter", email="renter@example.com")
    client = _client(renter)
    page = _page(client)
    assert KINDS["host.offline"].title in page
    assert "Supplying" in page
    emailed = [k for k in KINDS if k not in ("rental.ended", "host.online")]
    client.post(reverse("web:notifications-email"), {"emailed": emailed})
    prefs = NotificationSettings.objects.get(user=renter)
    assert sorted(prefs.email_muted) == ["host.online", "rental.ended"]
    # A row made for email choices keeps the default low-balance threshold on.
    assert prefs.low_balance_threshold_micros == settings.NOTIFY_LOW_BALANCE_DEFAULT_MICROS
    page = _page(client)
    assert 'value="rental.ended">' in page  # unchecked
    assert 'value="rental.running" checked>' in page
    assert "no-email" not in page


def test_security_notices_show_as_always_on_and_cannot_be_unticked() -> None:
    renter = f.make_user("renter", email="renter@example.com")
    client = _client(renter)
    page = _page(client)
    for kind in ("security.api_token_created", "security.ssh_key_added", "security.webhook_added"):
        assert f'value="{kind}" checked disabled> {KINDS[kind].title} ' in page
    assert page.count("(always on)") == 3
    # A form sent without them (a browser sends no disabled box; a script may try) mutes
    # only what may be muted.
    client.post(reverse("web:notifications-email"), {"emailed": ["rental.ended"]})
    muted = NotificationSettings.objects.get(user=renter).email_muted
    assert "rental.failed" in muted
    assert not [k for k in muted if k.startswith("security.")]
    assert emails.wanted(renter, "security.ssh_key_added")


def test_an_account_without_an_address_is_told_email_needs_one() -> None:
    assert 'id="no-email"' in _page(_client(f.make_user("renter", email="")))


# --- webhook endpoints ---


def test_adding_an_endpoint_shows_its_secret_once() -> None:
    renter = f.make_user("renter")
    client = _client(renter)
    added = client.post(
        reverse("web:webhook-add"),
        {"url": HOOK, "description": "ops", "kinds": ["rental.failed", "gpu.fault"]},
    )
    assert added.status_code == 201
    endpoint = WebhookEndpoint.objects.get(account=renter)
    assert endpoint.kinds == ["gpu.fault", "rental.failed"]
    assert endpoint.secret in added.content.decode()
    later = _page(client)
    assert endpoint.secret not in later
    assert f"whsec_…{endpoint.secret[-4:]}" in later
    assert f"<code>{HOOK}</code>" in later


@pytest.mark.parametrize(
    ("url", "error"),
    [
        ("http://example.com/hook", "https only"),
        ("https://10.1.2.3/x", "private or reserved address: 10.1.2.3"),
        ("https://169.254.169.254/", "private or reserved address: 169.254.169.254"),
    ],
)
def test_a_refused_url_is_shown_with_the_reason(url: str, error: str) -> None:
    renter = f.make_user("renter")
    refused = _client(renter).post(reverse("web:webhook-add"), {"url": url})
    assert refused.status_code == 400
    assert error in refused.content.decode()
    assert not WebhookEndpoint.objects.filter(account=renter).exists()


def test_rotating_shows_the_new_secret_once() -> None:
    renter = f.make_user("renter")
    endpoint = endpoints.add(renter, HOOK)
    old = endpoint.secret
    client = _client(renter)
    rotated = client.post(reverse("web:webhook-rotate", args=[endpoint.pk]))
    endpoint.refresh_from_db()
    assert endpoint.secret != old
    assert endpoint.secret in rotated.content.decode()
    assert endpoint.secret not in _page(client)


def test_an_endpoint_is_disabled_and_its_kinds_changed_then_deleted() -> None:
    renter = f.make_user("renter")
    endpoint = endpoints.add(renter, HOOK)
    client = _client(renter)
    client.post(
        reverse("web:webhook-update", args=[endpoint.pk]),
        {"description": "pager", "kinds": ["payout.paid"]},  # no "enabled": unticked
    )
    endpoint.refresh_from_db()
    assert (endpoint.enabled, endpoint.kinds, endpoint.description) == (
        False,
        ["payout.paid"],
        "pager",
    )
    client.post(reverse("web:webhook-delete", args=[endpoint.pk]))
    assert not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()


def test_sending_a_test_event_queues_a_delivery_shown_in_the_log() -> None:
    renter = f.make_user("renter")
    endpoint = endpoints.add(renter, HOOK)
    client = _client(renter)
    sent = client.post(reverse("web:webhook-test", args=[endpoint.pk]), follow=True)
    assert "Test event queued" in sent.content.decode()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.event.kind == TEST_KIND
    assert delivery.event.account == renter
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        attempts=2, last_status=502, last_error="HTTP 502 from the receiver", duration_ms=41
    )
    page = _page(client)
    assert str(delivery.event_id) in page
    assert TEST_KIND in page
    assert "HTTP 502 from the receiver" in page
    assert ">502<" in page
    assert ">41<" in page


def test_a_disabled_endpoint_says_so_instead_of_sending_a_test() -> None:
    renter = f.make_user("renter")
    endpoint = endpoints.add(renter, HOOK)
    endpoints.update(endpoint, kinds=[], enabled=False, description="")
    client = _client(renter)
    assert "Send test event: enable the endpoint first" in _page(client)
    refused = client.post(reverse("web:webhook-test", args=[endpoint.pk]), follow=True)
    assert "this endpoint is disabled: enable it to send a test event" in refused.content.decode()
    assert not WebhookDelivery.objects.filter(endpoint=endpoint).exists()


def test_the_delivery_log_shows_the_last_20() -> None:
    renter = f.make_user("renter")
    endpoint = endpoints.add(renter, HOOK)
    now = timezone.now()
    events = [
        Event.objects.create(account=renter, kind="rental.ended", due_at=now) for _ in range(21)
    ]
    for event in events:
        WebhookDelivery.objects.create(event=event, endpoint=endpoint, next_attempt_at=now)
    page = _page(_client(renter))
    assert sum(str(e.id) in page for e in events) == 20
    assert str(events[0].id) not in page  # the oldest


def test_another_account_cannot_see_or_touch_an_endpoint() -> None:
    owner, other = f.make_user("renter"), f.make_user("renter")
    endpoint = endpoints.add(owner, HOOK)
    client = _client(other)
    assert f"<code>{HOOK}</code>" not in _page(client)
    for name in ("webhook-delete", "webhook-test", "webhook-rotate", "webhook-update"):
        assert client.post(reverse(f"web:{name}", args=[endpoint.pk])).status_code == 404
    after = WebhookEndpoint.objects.get(pk=endpoint.pk)
    assert after.secret == endpoint.secret
    assert after.enabled
    assert not WebhookDelivery.objects.exists()


def test_changes_need_the_csrf_token() -> None:
    renter = f.make_user("renter")
    endpoint = endpoints.add(renter, HOOK)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(renter)
    assert strict.post(reverse("web:webhook-delete", args=[endpoint.pk])).status_code == 403
    assert strict.post(reverse("web:notifications-email"), {}).status_code == 403
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert not NotificationSettings.objects.filter(user=renter).exists()


def test_the_page_needs_a_login_and_has_no_inline_script() -> None:
    assert Client().get(reverse("web:notifications")).status_code == 302
    renter = f.make_user("renter")
    endpoints.add(renter, HOOK)
    page = _page(_client(renter))
    assert "<script>" not in page
    assert " on" + "click=" not in page


# --- unsubscribe ---


def _unsubscribe_url(user: User, kind: str) -> str:
    token = emails.unsubscribe_token(user.pk, kind)
    url = reverse("web:unsubscribe", args=[token])
    assert url == f"/notifications/unsubscribe/{token}/"  # the path emails.message() builds
    return url


def test_unsubscribe_asks_on_get_and_mutes_on_post() -> None:
    renter = f.make_user("renter", email="renter@example.com")
    url = _unsubscribe_url(renter, "rental.ended")
    asked = Client().get(url)
    assert asked.status_code == 200
    assert f"Stop emails about <strong>Rental ended</strong> for <strong>{renter.username}" in (
        asked.content.decode()
    )
    assert not NotificationSettings.objects.filter(user=renter).exists()  # a GET changes nothing
    done = Client().post(url)
    assert done.status_code == 200
    assert emails.SETTINGS_PATH in done.content.decode()
    Client().post(url)  # twice: still one entry
    prefs = NotificationSettings.objects.get(user=renter)
    assert prefs.email_muted == ["rental.ended"]
    assert prefs.low_balance_threshold_micros == settings.NOTIFY_LOW_BALANCE_DEFAULT_MICROS
    assert not emails.wanted(renter, "rental.ended")
    assert emails.wanted(renter, "rental.failed")


def test_one_click_unsubscribe_works_without_a_csrf_token() -> None:
    renter = f.make_user("renter", email="renter@example.com")
    NotificationSettings.objects.create(user=renter, email_muted=["gpu.fault"])
    mail_client = Client(enforce_csrf_checks=True)
    response = mail_client.post(
        _unsubscribe_url(renter, "payout.paid"),
        "List-Unsubscribe=One-Click",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 200
    assert NotificationSettings.objects.get(user=renter).email_muted == ["gpu.fault", "payout.paid"]


def test_a_security_notice_cannot_be_unsubscribed() -> None:
    renter = f.make_user("renter", email="renter@example.com")
    url = _unsubscribe_url(renter, "security.api_token_created")
    asked = Client().get(url)
    assert asked.status_code == 200
    assert "cannot be turned off" in asked.content.decode()
    assert 'id="unsubscribe-form"' not in asked.content.decode()
    refused = Client(enforce_csrf_checks=True).post(
        url, "List-Unsubscribe=One-Click", content_type="application/x-www-form-urlencoded"
    )
    assert refused.status_code == 400
    assert "cannot be turned off" in refused.content.decode()
    assert not NotificationSettings.objects.filter(user=renter).exists()
    assert emails.wanted(renter, "security.api_token_created")


@pytest.mark.parametrize("method", ["get", "post"])
def test_a_forged_unsubscribe_token_is_404(method: str) -> None:
    renter = f.make_user("renter")
    good = emails.unsubscribe_token(renter.pk, "rental.ended")
    for token in (good[:-2] + "xx", "nonsense"):
        response = getattr(Client(), method)(reverse("web:unsubscribe", args=[token]))
        assert response.status_code == 404
        assert "This unsubscribe link is not valid" in response.content.decode()
    assert not NotificationSettings.objects.filter(user=renter).exists()
