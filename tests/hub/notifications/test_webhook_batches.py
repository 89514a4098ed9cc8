"""Webhook runs (hub/notifications/tasks.py and picking.py) in this process against a real HTTP
receiver: one account's hanging endpoints never delay another account past one run, endpoints
that keep failing go to the slow lane, a test event is tried once, a redirect is not followed,
a name is delivered to the address that was checked, a deactivated account gets nothing."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from hub.accounts.models import User
from hub.notifications import addresses, endpoints, picking, signing, tasks
from hub.notifications.events import emit
from hub.notifications.kinds import TEST_KIND
from hub.notifications.models import Event, WebhookDelivery, WebhookEndpoint
from tests.hub import factories as f
from tests.support.webhook_receiver import Receiver, webhook_receiver

pytestmark = pytest.mark.django_db

TIMEOUT_S = 2


def _backlog(receiver: Receiver, *, endpoints_: int, each: int, failures: int) -> User:
    """An account whose endpoints all hang, each with ``each`` deliveries due for an hour."""
    user = f.make_user(email="")
    long_ago = timezone.now() - timedelta(hours=1)
    for _ in range(endpoints_):
        hook = WebhookEndpoint.objects.create(
            account=user,
            url=receiver.url("/hang"),
            secret=signing.new_secret(),
            consecutive_failures=failures,
        )
        events = Event.objects.bulk_create(
            Event(account=user, kind="payout.paid", due_at=long_ago, state="done")
            for _ in range(each)
        )
        WebhookDelivery.objects.bulk_create(
            WebhookDelivery(event=e, endpoint=hook, next_attempt_at=long_ago) for e in events
        )
    return user


def _fresh_delivery(receiver: Receiver) -> WebhookEndpoint:
    """Another account's endpoint with one delivery just due (the newest of all)."""
    user = f.make_user(email="")
    hook = endpoints.add(user, receiver.url("/ok"), kinds=["payout.paid"])
    emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
    tasks.process_events()
    return hook


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True, WEBHOOK_TIMEOUT_S=TIMEOUT_S)
def test_one_accounts_hanging_backlog_does_not_delay_another_account_past_one_run() -> None:
    with webhook_receiver() as receiver:
        # Ten endpoints that only just began to hang (still in the healthy lane), 20 each.
        _backlog(receiver, endpoints_=10, each=20, failures=0)
        other = _fresh_delivery(receiver)
        tried = tasks.deliver_webhooks()
        assert len(receiver.at("/ok")) == 1
    assert WebhookDelivery.objects.get(endpoint=other).state == "delivered"
    # The backlog's account took its share of the batch, not all of it.
    assert tried == tasks.PER_ACCOUNT_IN_BATCH + 1


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True, WEBHOOK_TIMEOUT_S=TIMEOUT_S)
def test_endpoints_that_keep_failing_go_to_the_slow_lane_and_hold_no_healthy_run() -> None:
    with webhook_receiver() as receiver:
        slow_account = _backlog(
            receiver, endpoints_=5, each=20, failures=picking.SLOW_AFTER_FAILURES
        )
        other = _fresh_delivery(receiver)
        started = time.monotonic()
        assert tasks.deliver_webhooks() == 1
        # The healthy run never waited on a hanging endpoint.
        assert time.monotonic() - started < TIMEOUT_S
        assert receiver.hanging == 0
        assert WebhookDelivery.objects.get(endpoint=other).state == "delivered"
        # The slow lane tries them, a few at a time.
        slow = picking.LANES[picking.SLOW]
        assert tasks.deliver_webhooks(lane=picking.SLOW) == slow.per_account
    tried = WebhookDelivery.objects.filter(endpoint__account=slow_account, attempts=1)
    assert tried.count() == slow.per_account
    assert all(
        tried.filter(endpoint=hook).count() <= slow.per_endpoint
        for hook in WebhookEndpoint.objects.filter(account=slow_account)
    )


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_success_moves_an_endpoint_back_to_the_healthy_lane() -> None:
    with webhook_receiver() as receiver:
        user = f.make_user(email="")
        hook = endpoints.add(user, receiver.url("/ok"), kinds=["payout.paid"])
        WebhookEndpoint.objects.filter(pk=hook.pk).update(consecutive_failures=5)
        emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
        tasks.process_events()
        assert tasks.deliver_webhooks() == 0  # not the healthy lane's
        assert tasks.deliver_webhooks(lane=picking.SLOW) == 1
    hook.refresh_from_db()
    assert hook.consecutive_failures == 0


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_test_event_is_posted_signed_and_tried_once() -> None:
    user = f.make_user(email="")
    with webhook_receiver() as receiver:
        down = endpoints.add(user, receiver.url("/always-500"))
        fine = endpoints.add(user, receiver.url("/ok"))
        Event.objects.filter(kind="security.webhook_added").delete()
        endpoints.send_test(down)
        endpoints.send_test(fine)
        assert tasks.deliver_webhooks() == 2
        (got,) = receiver.at("/ok", kind=TEST_KIND)
        assert signing.verify(
            fine.secret, got.headers["cloudgpu-signature"], got.body, now=int(time.time())
        )
        failed = WebhookDelivery.objects.get(endpoint=down)
        # Tried once: failed at once, with its answer, and not retried.
        assert (failed.state, failed.attempts, failed.last_status) == ("failed", 1, 500)
        assert tasks.deliver_webhooks() == 0
        # Another test may go now that the last one was tried.
        endpoints.send_test(down)
        assert tasks.deliver_webhooks() == 1
        assert len(receiver.at("/always-500")) == 2


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_redirect_is_not_followed_and_counts_as_a_failure() -> None:
    user = f.make_user(email="")
    with webhook_receiver() as receiver:
        hook = endpoints.add(user, receiver.url("/redirect-to/elsewhere"), kinds=["payout.paid"])
        emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
        tasks.process_events()
        assert tasks.deliver_webhooks() == 1
        assert len(receiver.at("/redirect-to/elsewhere")) == 1
        assert receiver.at("/elsewhere") == []
    delivery = WebhookDelivery.objects.get(endpoint=hook)
    assert (delivery.state, delivery.last_status, delivery.last_error) == (
        "pending",
        302,
        "answered 302",
    )
    hook.refresh_from_db()
    assert hook.consecutive_failures == 1


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_loopback_name_is_delivered_in_development_to_the_address_checked() -> None:
    user = f.make_user(email="")
    with webhook_receiver() as receiver:
        hook = endpoints.add(user, f"http://localhost:{receiver.port}/ok", kinds=["payout.paid"])
        emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
        tasks.process_events()
        tasks.deliver_webhooks()
        (got,) = receiver.at("/ok")
    # Sent to the address the name resolved to (the receiver listens on 127.0.0.1 only),
    # with the name in Host.
    assert got.headers["host"] == f"localhost:{receiver.port}"
    assert WebhookDelivery.objects.get(endpoint=hook).state == "delivered"


@override_settings(WEBHOOK_ALLOW_LOOPBACK=False)
def test_a_name_that_resolves_to_a_private_address_at_delivery_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    user = f.make_user(email="")
    with webhook_receiver() as receiver:
        # Public when saved (a name passes the form), loopback (where the receiver is) when
        # delivered: a DNS answer that changed, or was made to.
        hook = endpoints.add(
            user, f"https://rebind.cloudgpu.test:{receiver.port}/ok", kinds=["payout.paid"]
        )
        monkeypatch.setattr(
            addresses,
            "lookup",
            lambda host, port: ["127.0.0.1"] if host == "rebind.cloudgpu.test" else [],
        )
        emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
        tasks.process_events()
        tasks.deliver_webhooks()
        assert receiver.received == []
    delivery = WebhookDelivery.objects.get(endpoint=hook)
    assert (delivery.attempts, delivery.last_status) == (1, None)
    # The same words as for no answer, and no address: the log is the account's to read.
    assert delivery.last_error == (
        "refused: rebind.cloudgpu.test does not resolve to a public address"
    )


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_deactivated_accounts_waiting_deliveries_are_not_posted() -> None:
    user = f.make_user(email="")
    with webhook_receiver() as receiver:
        hook = endpoints.add(user, receiver.url("/ok"), kinds=["payout.paid"])
        emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
        tasks.process_events()
        User.objects.filter(pk=user.pk).update(is_active=False)
        assert tasks.deliver_webhooks() == 0
        assert receiver.received == []
    delivery = WebhookDelivery.objects.get(endpoint=hook)
    assert (delivery.state, delivery.last_error) == ("failed", "the account is deactivated")
