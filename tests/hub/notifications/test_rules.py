"""hub/notifications: the signature scheme, where webhooks may go, the delivery body and
retry schedule, coalescing and pruning (in the database, without a worker)."""

from __future__ import annotations

import itertools
import json
import socket
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from hub.notifications import addresses, delivery, endpoints, signing, tasks
from hub.notifications.events import MAX_ITEMS, MAX_STRING, bounded, emit
from hub.notifications.models import Event, WebhookDelivery, WebhookEndpoint
from tests.hub import factories as f

# --- signing ---


def test_a_signature_verifies_only_with_its_secret_body_and_time() -> None:
    secret, body, now = signing.new_secret(), b'{"id":"1"}', 1_700_000_000
    header = signing.header(secret, now, body)
    assert header.startswith(f"t={now},v1=")
    assert signing.verify(secret, header, body, now=now + 10)
    assert not signing.verify(signing.new_secret(), header, body, now=now)
    assert not signing.verify(secret, header, body + b" ", now=now)
    assert not signing.verify(secret, header, body, now=now + 301)  # a replay, later
    assert not signing.verify(secret, "v1=" + signing.signature(secret, now, body), body, now=now)
    assert not signing.verify(secret, "t=soon,v1=00", body, now=now)


def test_secrets_are_long_random_and_prefixed() -> None:
    made = {signing.new_secret() for _ in range(50)}
    assert len(made) == 50
    assert all(s.startswith("whsec_") and len(s) >= 40 for s in made)


# --- where webhooks may go ---


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://example.com/hook", "https only"),
        ("ftp://example.com/hook", "must start with https://"),
        ("https:///hook", "must start with https://"),
        ("https://user:pw@example.com/", "user name or password"),
        ("https://example.com/#frag", "fragment"),
        ("https://10.1.2.3/x", "private or reserved address: 10.1.2.3"),
        ("https://169.254.169.254/latest/meta-data", "private or reserved address"),
        ("https://[fd00::1]/x", "private or reserved address"),
        ("https://[::ffff:192.168.1.1]/x", "private or reserved address"),
        ("https://100.64.0.1/x", "private or reserved address"),
        ("https://example.com:99999/", "not a URL"),
        ("https://example.com/" + "a" * 500, "longer than 500"),
        ("https://localhost/hook", "loopback"),
        ("https://127.0.0.1/hook", "loopback"),
        ("https://example.com/a\x01b", "control characters"),
        ("https://example.com/a b", "control characters"),
        ("https://[64:ff9b::a00:5]/x", "private or reserved address"),  # NAT64 of 10.0.0.5
        ("https://[::a00:5]/x", "private or reserved address"),  # IPv4-compatible 10.0.0.5
        ("https://" + "a" * 64 + ".com/x", "not a valid host name"),
    ],
)
@override_settings(WEBHOOK_ALLOW_LOOPBACK=False)
def test_urls_a_webhook_may_not_have(url: str, why: str) -> None:
    with pytest.raises(addresses.EndpointRefused, match=why):
        addresses.check_url(url)


def test_an_international_name_goes_on_the_wire_in_idna() -> None:
    assert addresses.ascii_host("bücher.de") == "xn--bcher-kva.de"
    addresses.check_url("https://bücher.de/hook")


@override_settings(WEBHOOK_ALLOW_LOOPBACK=False)
def test_public_https_urls_are_fine() -> None:
    for url in (
        "https://example.com/hook",
        "https://93.184.215.14:8443/a?b=c",
        "https://[2606:4700::1]/",
    ):
        addresses.check_url(url)


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_in_development_loopback_over_http_is_fine_and_private_still_is_not() -> None:
    addresses.check_url("http://127.0.0.1:8080/hook")
    addresses.check_url("http://localhost:8080/hook")
    with pytest.raises(addresses.EndpointRefused, match="https only"):
        addresses.check_url("http://example.com/hook")
    with pytest.raises(addresses.EndpointRefused, match="private"):
        addresses.check_url("https://192.168.0.10/hook")


@override_settings(WEBHOOK_ALLOW_LOOPBACK=False)
def test_a_name_is_checked_against_what_it_resolves_to_at_delivery() -> None:
    # This machine's own name passes the form's check (it is a name), and resolves to a
    # loopback or private address: at delivery, the address is what counts. The same words
    # for a private answer and none: the log must not map the hub's network.
    name = socket.gethostname()
    with pytest.raises(addresses.EndpointRefused, match=f"{name} does not resolve to a public"):
        addresses.resolve(f"https://{name}/hook")
    with pytest.raises(addresses.EndpointRefused, match="invalid does not resolve to a public"):
        addresses.resolve("https://no-such-name.invalid/hook")


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_resolve_gives_the_checked_address_and_the_name_for_host_and_tls() -> None:
    target = addresses.resolve("https://localhost:8443/a/b?c=1")
    assert (target.scheme, target.host, target.port, target.path) == (
        "https",
        "localhost",
        8443,
        "/a/b?c=1",
    )
    assert target.address in ("127.0.0.1", "::1")


# --- body and retries ---


@pytest.mark.django_db
def test_the_body_is_the_event_as_compact_sorted_json() -> None:
    user = f.make_user()
    event = Event.objects.create(
        account=user, kind="payout.paid", data={"b": 1, "a": "x"}, due_at=timezone.now()
    )
    document = json.loads(delivery.body(event))
    assert document == {
        "id": str(event.id),
        "type": "payout.paid",
        "created": event.created_at.isoformat().replace("+00:00", "Z"),
        "data": {"a": "x", "b": 1},
    }
    assert b" " not in delivery.body(event)


@override_settings(WEBHOOK_RETRY_BASE_S=30)
def test_retries_back_off_to_every_eight_hours() -> None:
    waits = [delivery.retry_delay(n).total_seconds() for n in range(1, 12)]
    assert 27 <= waits[0] <= 33
    assert all(later >= earlier * 0.8 for earlier, later in itertools.pairwise(waits))
    assert 8 * 3600 * 0.9 <= waits[-1] <= 8 * 3600 * 1.1
    # Within a day, the attempts a receiver down for a day sees.
    total, attempts = 0.0, 0
    while total <= 86400:
        attempts += 1
        total += 30 * delivery.RETRY_STEPS[min(attempts, len(delivery.RETRY_STEPS)) - 1]
    assert 9 <= attempts <= 12


# --- coalescing and pruning ---


@pytest.mark.django_db
@override_settings(NOTIFY_COALESCE_S=30)
def test_a_burst_of_one_kind_is_one_event_per_account_and_other_kinds_are_their_own() -> None:
    a, b = f.make_user(), f.make_user()
    now = timezone.now()
    for n in range(MAX_ITEMS + 20):
        emit(a.pk, "host.offline", {"host": str(n), "name": f"h{n}"}, now=now)
    emit(b.pk, "host.offline", {"host": "x", "name": "hx"}, now=now)
    emit(a.pk, "host.online", {"host": "0", "name": "h0"}, now=now)
    emit(a.pk, "payout.paid", {"payout": "1", "amount": "1.00"}, now=now)
    emit(a.pk, "payout.paid", {"payout": "2", "amount": "2.00"}, now=now)
    offline = Event.objects.get(account=a, kind="host.offline")
    assert offline.data["count"] == MAX_ITEMS + 20
    assert len(offline.data["items"]) == MAX_ITEMS
    assert offline.due_at == now + timedelta(seconds=30)
    assert Event.objects.filter(account=b).count() == 1
    assert Event.objects.filter(account=a, kind="host.online").count() == 1
    assert Event.objects.filter(account=a, kind="payout.paid").count() == 2  # never coalesced
    # Once its window closed, the same kind starts a new event.
    emit(a.pk, "host.offline", {"host": "late", "name": "late"}, now=now + timedelta(seconds=31))
    assert Event.objects.filter(account=a, kind="host.offline").count() == 2


@pytest.mark.django_db
@override_settings(NOTIFICATION_RETENTION_DAYS=30, WEBHOOK_ALLOW_LOOPBACK=True)
def test_old_done_events_are_pruned_unless_a_delivery_is_still_pending() -> None:
    user = f.make_user()
    endpoint = endpoints.add(user, "http://127.0.0.1:9/hook")
    now = timezone.now()
    old, kept_pending, recent = (
        Event.objects.create(account=user, kind="payout.paid", due_at=now, state=Event.State.DONE)
        for _ in range(3)
    )
    Event.objects.filter(pk__in=[old.pk, kept_pending.pk]).update(
        created_at=now - timedelta(days=31)
    )
    WebhookDelivery.objects.create(
        event=old, endpoint=endpoint, next_attempt_at=now, state="delivered"
    )
    WebhookDelivery.objects.create(event=kept_pending, endpoint=endpoint, next_attempt_at=now)
    assert tasks.prune(now) == 1
    left = Event.objects.filter(kind="payout.paid").values_list("pk", flat=True)
    assert set(left) == {kept_pending.pk, recent.pk}
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()


def test_what_agents_report_is_cut_before_it_is_an_event() -> None:
    data = bounded({"reason": "x" * 100_000, "items": list(range(1000)), "n": 3})
    assert len(data["reason"]) == MAX_STRING
    assert data["reason"].endswith("…")
    assert len(data["items"]) == 100
    assert data["n"] == 3


@pytest.mark.django_db
@override_settings(NOTIFY_COALESCE_S=30)
def test_an_event_whose_email_is_being_retried_takes_no_more_items() -> None:
    user = f.make_user()
    now = timezone.now()
    emit(user.pk, "host.offline", {"host": "1", "name": "a"}, now=now)
    Event.objects.filter(account=user).update(email_attempts=1)  # a sweep's email failed
    emit(user.pk, "host.offline", {"host": "2", "name": "b"}, now=now + timedelta(seconds=1))
    counts = sorted(e.data["count"] for e in Event.objects.filter(account=user))
    assert counts == [1, 1]


@pytest.mark.django_db
@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_test_event_waits_only_for_the_last_one_to_be_tried() -> None:
    user = f.make_user()
    endpoint = endpoints.add(user, "http://127.0.0.1:9/hook")
    endpoints.send_test(endpoint)
    with pytest.raises(endpoints.EndpointError, match="already on its way"):
        endpoints.send_test(endpoint)
    WebhookDelivery.objects.filter(endpoint=endpoint).update(state="failed", attempts=1)
    endpoints.send_test(endpoint)


@pytest.mark.django_db
@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_disabled_endpoint_gets_no_test_event() -> None:
    user = f.make_user()
    endpoint = endpoints.add(user, "http://127.0.0.1:9/hook")
    endpoints.update(endpoint, kinds=[], enabled=False, description="")
    with pytest.raises(endpoints.EndpointError, match="disabled: enable it"):
        endpoints.send_test(endpoint)
    assert not WebhookDelivery.objects.filter(endpoint=endpoint).exists()


@override_settings(WEBHOOK_ALLOW_LOOPBACK=False)
def test_a_name_is_refused_when_any_address_it_has_now_is_not_public(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The resolver's answers are the test's own (DNS is what an attacker controls): one
    # private answer among public ones refuses the name, a public one is delivered to.
    answers = {
        "mixed.cloudgpu.test": ["93.184.215.14", "10.1.2.3"],
        "public.cloudgpu.test": ["93.184.215.14"],
    }
    monkeypatch.setattr(addresses, "lookup", lambda host, port: answers.get(host, []))
    with pytest.raises(addresses.EndpointRefused, match=r"mixed\.cloudgpu\.test does not resolve"):
        addresses.resolve("https://mixed.cloudgpu.test/hook")
    target = addresses.resolve("https://public.cloudgpu.test/hook")
    assert (target.host, target.address) == ("public.cloudgpu.test", "93.184.215.14")
