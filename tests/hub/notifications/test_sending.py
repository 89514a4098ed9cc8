"""hub/notifications/tasks.py in this process, against a real SMTP server and a real HTTP
receiver: an SMTP outage delays an email without losing it, muted kinds and address-less
accounts get none, and one endpoint's backlog takes only part of a batch."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from hub.lib.ports import free_port
from hub.notifications import endpoints, tasks
from hub.notifications.events import emit
from hub.notifications.models import (
    Event,
    NotificationSettings,
    WebhookDelivery,
    WebhookEndpoint,
)
from tests.hub import factories as f
from tests.support.smtp_server import smtp_server
from tests.support.webhook_receiver import webhook_receiver

pytestmark = pytest.mark.django_db

SMTP = "django.core.mail.backends.smtp.EmailBackend"


def test_an_smtp_outage_delays_the_email_and_loses_nothing() -> None:
    user = f.make_user(email="someone@example.test")
    emit(user.pk, "payout.paid", {"payout": "3", "amount": "10.00"})
    with override_settings(EMAIL_BACKEND=SMTP, EMAIL_HOST="127.0.0.1", EMAIL_PORT=free_port()):
        assert tasks.process_events() == 1
    event = Event.objects.get(account=user)
    assert event.state == Event.State.PENDING
    assert event.email_attempts == 1
    assert "Connection refused" in event.email_error or "Errno" in event.email_error
    assert event.due_at > timezone.now()
    assert tasks.process_events() == 0  # not due again yet
    Event.objects.filter(pk=event.pk).update(due_at=timezone.now() - timedelta(seconds=1))
    with smtp_server() as mailbox:
        with override_settings(EMAIL_BACKEND=SMTP, EMAIL_HOST="127.0.0.1", EMAIL_PORT=mailbox.port):
            assert tasks.process_events() == 1
        assert len(mailbox.to(user.email)) == 1
    event.refresh_from_db()
    assert (event.state, event.email_state) == (Event.State.DONE, Event.EmailState.SENT)


def test_a_muted_kind_and_an_account_without_address_get_no_email() -> None:
    muted = f.make_user(email="muted@example.test")
    NotificationSettings.objects.create(user=muted, email_muted=["payout.paid"])
    nameless = f.make_user(email="")
    emit(muted.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
    emit(nameless.pk, "payout.paid", {"payout": "2", "amount": "1.00"})
    emit(muted.pk, "payout.refused", {"payout": "3", "amount": "1.00", "reason": "no"})
    with smtp_server() as mailbox:
        with override_settings(EMAIL_BACKEND=SMTP, EMAIL_HOST="127.0.0.1", EMAIL_PORT=mailbox.port):
            assert tasks.process_events() == 3
        assert [m["Subject"] for m in mailbox.messages] == ["CloudGPU: Payout refused"]
    states = dict(Event.objects.values_list("kind", "email_state").filter(account=muted))
    assert states == {"payout.paid": "skipped", "payout.refused": "sent"}
    assert Event.objects.get(account=nameless).email_state == Event.EmailState.SKIPPED


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_one_endpoints_backlog_takes_only_part_of_a_batch() -> None:
    user = f.make_user(email="")
    with webhook_receiver() as receiver:
        backlog = endpoints.add(user, receiver.url("/ok"), kinds=["payout.paid"])
        other = endpoints.add(user, receiver.url("/ok-other"), kinds=["payout.refused"])
        for n in range(tasks.PER_ENDPOINT_IN_BATCH + 15):
            emit(user.pk, "payout.paid", {"payout": str(n), "amount": "1.00"})
        emit(user.pk, "payout.refused", {"payout": "x", "amount": "1.00", "reason": "no"})
        tasks.process_events()
        assert tasks.deliver_webhooks() == tasks.PER_ENDPOINT_IN_BATCH + 1
        assert len(receiver.at("/ok")) == tasks.PER_ENDPOINT_IN_BATCH
        assert len(receiver.at("/ok-other")) == 1
        # The rest goes in the next runs.
        while tasks.deliver_webhooks():
            pass
        assert len(receiver.at("/ok")) == tasks.PER_ENDPOINT_IN_BATCH + 15
    assert not WebhookDelivery.objects.exclude(state="delivered").exists()
    backlog.refresh_from_db()
    other.refresh_from_db()
    assert backlog.last_success_at is not None
    assert backlog.consecutive_failures == 0


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True, WEBHOOK_RETRY_FOR_S=0)
def test_a_delivery_past_its_retry_window_is_marked_failed() -> None:
    user = f.make_user(email="")
    with webhook_receiver() as receiver:
        endpoint = endpoints.add(user, receiver.url("/always-500"), kinds=["payout.paid"])
        emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
        tasks.process_events()
        tasks.deliver_webhooks()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (delivery.state, delivery.attempts, delivery.last_status) == ("failed", 1, 500)
    assert delivery.last_error == "answered 500"
    endpoint.refresh_from_db()
    assert endpoint.consecutive_failures == 1


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_backlog_of_hundreds_leaves_room_for_every_other_endpoint() -> None:
    user, other_user = f.make_user(email=""), f.make_user(email="")
    with webhook_receiver() as receiver:
        backlog = endpoints.add(user, receiver.url("/always-500"), kinds=["payout.paid"])
        other = endpoints.add(other_user, receiver.url("/ok"), kinds=["payout.paid"])
        event = Event.objects.create(account=user, kind="payout.paid", due_at=timezone.now())
        long_ago = timezone.now() - timedelta(hours=1)
        rows = [
            Event(account=user, kind="payout.paid", due_at=long_ago, state="done")
            for _ in range(tasks.DELIVERY_BATCH * 2 + 20)
        ]
        Event.objects.bulk_create(rows)
        WebhookDelivery.objects.bulk_create(
            WebhookDelivery(event=e, endpoint=backlog, next_attempt_at=long_ago) for e in rows
        )
        emit(other_user.pk, "payout.paid", {"payout": "9", "amount": "1.00"})
        tasks.process_events()
        assert tasks.deliver_webhooks() == tasks.PER_ENDPOINT_IN_BATCH + 1
        assert len(receiver.at("/ok")) == 1
    assert WebhookDelivery.objects.get(endpoint=other).state == "delivered"
    assert event.pk  # the backlog's own new event waits its turn like the rest


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_url_that_cannot_be_sent_fails_alone() -> None:
    user = f.make_user(email="")
    with webhook_receiver() as receiver:
        fine = endpoints.add(user, receiver.url("/ok"), kinds=["payout.paid"])
        # Saved around the form's check (a row changed by hand).
        broken = WebhookEndpoint.objects.create(
            account=user, url=receiver.url("/a\x01b"), secret="whsec_x", kinds=["payout.paid"]
        )
        emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
        tasks.process_events()
        assert tasks.deliver_webhooks() == 2
    assert WebhookDelivery.objects.get(endpoint=fine).state == "delivered"
    failed = WebhookDelivery.objects.get(endpoint=broken)
    assert (failed.state, failed.attempts) == ("pending", 1)
    assert failed.last_error.startswith("refused: the URL may not contain")


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True, WEBHOOK_RETRY_FOR_S=0)
def test_a_delivery_to_an_endpoint_switched_off_ends_with_the_retry_window() -> None:
    user = f.make_user(email="")
    endpoint = endpoints.add(user, "http://127.0.0.1:9/hook", kinds=["payout.paid"])
    emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
    tasks.process_events()
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(enabled=False)
    assert tasks.deliver_webhooks() == 0
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (delivery.state, delivery.last_error) == ("failed", "the endpoint is off")
