"""Email through hub/notifications/tasks.py in this process, against a real SMTP server: a mail
server that is down, hangs or refuses one recipient holds no webhook and no other account's
mail; a failed email backs off for hours; security notices cannot be muted; deactivated
accounts get nothing; what a mail says and carries."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from hub.accounts.models import User
from hub.lib.ports import free_port
from hub.notifications import endpoints, mailing, tasks
from hub.notifications.events import emit
from hub.notifications.models import Event, NotificationSettings, WebhookDelivery
from tests.hub import factories as f
from tests.support.smtp_server import hanging_smtp_server, smtp_server

pytestmark = pytest.mark.django_db

SMTP = "django.core.mail.backends.smtp.EmailBackend"


def _smtp(port: int, **more: object) -> override_settings:
    return override_settings(EMAIL_BACKEND=SMTP, EMAIL_HOST="127.0.0.1", EMAIL_PORT=port, **more)


def _accounts_with_hooks(count: int) -> list[User]:
    users = [f.make_user(email=f"person{n}@example.test") for n in range(count)]
    with override_settings(WEBHOOK_ALLOW_LOOPBACK=True):
        for user in users:
            endpoints.add(user, "http://127.0.0.1:9/hook", kinds=["payout.paid"])
    # Only the payouts below are these tests' business, not the endpoints' notices.
    Event.objects.filter(kind="security.webhook_added").delete()
    for n, user in enumerate(users):
        emit(user.pk, "payout.paid", {"payout": str(n), "amount": "1.00"})
    return users


def _payouts() -> list[Event]:
    return list(Event.objects.filter(kind="payout.paid").order_by("created_at"))


def test_a_mail_server_that_is_down_holds_no_webhook() -> None:
    _accounts_with_hooks(3)
    with _smtp(free_port()):
        tasks.process_events()
    events = _payouts()
    # Every event's delivery is made; the mail server's refusal ended the run's mail work
    # after one try (the others would only fail the same way).
    assert WebhookDelivery.objects.filter(event__in=events).count() == 3
    assert [e.email_attempts for e in events] == [1, 0, 0]
    assert all(e.state == Event.State.PENDING for e in events)
    # Once the server is back, the rest go out and the events are done.
    with smtp_server() as mailbox, _smtp(mailbox.port):
        Event.objects.update(due_at=timezone.now())
        tasks.process_events()
        assert len(mailbox.messages) == 3
    assert {e.state for e in _payouts()} == {Event.State.DONE}
    assert WebhookDelivery.objects.count() == 3


def test_a_mail_server_that_hangs_holds_no_webhook() -> None:
    _accounts_with_hooks(3)
    with hanging_smtp_server() as port, _smtp(port, EMAIL_TIMEOUT=1):
        started = time.monotonic()
        tasks.process_events()
        took = time.monotonic() - started
    assert WebhookDelivery.objects.count() == 3
    assert [e.email_attempts for e in _payouts()] == [1, 0, 0]
    assert took < 5  # one EMAIL_TIMEOUT, not one per event
    assert "timed out" in _payouts()[0].email_error


def test_a_refused_recipient_is_set_aside_and_the_others_get_their_mail() -> None:
    refused, fine = _accounts_with_hooks(2)
    with smtp_server() as mailbox, _smtp(mailbox.port):
        mailbox.refused.add(refused.email)
        assert tasks.process_events() == 2
        assert [m["To"] for m in mailbox.messages] == [fine.email]
    failed, sent = _payouts()
    # 550: no such mailbox, for good: not retried.
    assert (failed.state, failed.email_state) == (Event.State.DONE, Event.EmailState.FAILED)
    assert failed.email_error.startswith("SMTPRecipientsRefused")
    assert (sent.state, sent.email_state) == (Event.State.DONE, Event.EmailState.SENT)


def test_a_failed_email_backs_off_for_hours_and_gives_up_after_a_day() -> None:
    user = f.make_user(email="late@example.test")
    emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
    emit(user.pk, "payout.paid", {"payout": "2", "amount": "1.00"})
    recent, old = _payouts()
    # The 8th failure of a recent event waits about 4 hours; a 9th near the end of its day
    # would come after the day: it is the last.
    Event.objects.filter(pk__in=[recent.pk, old.pk]).update(email_attempts=7, webhooks_made=True)
    Event.objects.filter(pk=old.pk).update(
        created_at=timezone.now() - timedelta(hours=20), email_attempts=8
    )
    with _smtp(free_port()):
        tasks.process_events()
        tasks.process_events()  # the server ends each run's mail: one event a run
    recent.refresh_from_db()
    old.refresh_from_db()
    wait = recent.due_at - timezone.now()
    assert timedelta(hours=3.5) < wait < timedelta(hours=4.5)
    assert (recent.state, recent.email_attempts) == (Event.State.PENDING, 8)
    assert (old.state, old.email_state, old.email_attempts) == ("done", "failed", 9)
    # The whole schedule: growing to every 8 hours, about 11 tries in a day.
    waits = [mailing.retry_delay(n).total_seconds() for n in range(1, 12)]
    assert 54 <= waits[0] <= 66
    assert 8 * 3600 * 0.9 <= waits[-1] <= 8 * 3600 * 1.1


def test_security_notices_are_emailed_even_if_muted_and_carry_no_unsubscribe() -> None:
    user = f.make_user(email="owner@example.test")
    # Muted before security notices could not be: still sent.
    NotificationSettings.objects.create(
        user=user, email_muted=["security.ssh_key_added", "payout.paid"]
    )
    emit(user.pk, "security.ssh_key_added", {"fingerprint": "SHA256:x", "comment": "c"})
    emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
    with smtp_server() as mailbox, _smtp(mailbox.port):
        tasks.process_events()
        (mail,) = mailbox.messages
    assert mail["Subject"] == "CloudGPU: New SSH key"
    assert mail["List-Unsubscribe"] is None
    assert "/notifications/unsubscribe/" not in mail.get_body(("plain",)).get_content()
    assert "always sent" in mail.get_body(("plain",)).get_content()


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_adding_an_endpoint_sends_a_security_notice_naming_only_its_host() -> None:
    user = f.make_user(email="owner@example.test")
    endpoint = endpoints.add(user, "http://localhost:9/hooks/key-abc123?token=zz")
    (event,) = Event.objects.filter(account=user)
    assert event.kind == "security.webhook_added"
    assert event.data == {"endpoint": endpoint.pk, "host": "localhost", "kinds": "every kind"}
    with smtp_server() as mailbox, _smtp(mailbox.port):
        tasks.process_events()
        (mail,) = mailbox.messages
    assert mail["Subject"] == "CloudGPU: New webhook endpoint"
    text = mail.get_body(("plain",)).get_content()
    assert "A new webhook endpoint to localhost" in text
    assert "key-abc123" not in text
    assert "zz" not in text


def test_mail_is_auto_generated_and_a_low_balance_names_rentals_and_a_time() -> None:
    user = f.make_user(email="renter@example.test")
    runs_out = timezone.now() + timedelta(hours=3, minutes=2)
    emit(
        user.pk,
        "balance.low",
        {
            "balance": "4.00",
            "threshold": "5.00",
            "burn_per_hour": "1.30",
            "runs_out_at": runs_out.isoformat(timespec="seconds"),
            "rentals": [{"lease": "12"}, {"lease": "15"}],
        },
    )
    with smtp_server() as mailbox, _smtp(mailbox.port):
        tasks.process_events()
        (mail,) = mailbox.messages
    assert mail["Auto-Submitted"] == "auto-generated"
    text = " ".join(mail.get_body(("plain",)).get_content().split())
    assert "Your running rentals (12 and 15) cost 1.30 USD an hour" in text
    assert f"around {runs_out:%H:%M} UTC on {runs_out.day} {runs_out:%B %Y}" in text
    assert "about 3 hours after this notice" in text
    assert runs_out.isoformat(timespec="seconds") not in text


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_deactivated_account_gets_no_email_and_no_webhook() -> None:
    user = f.make_user(email="gone@example.test")
    endpoints.add(user, "http://127.0.0.1:9/hook", kinds=["payout.paid"])
    Event.objects.filter(kind="security.webhook_added").delete()
    User.objects.filter(pk=user.pk).update(is_active=False)
    emit(user.pk, "payout.paid", {"payout": "1", "amount": "1.00"})
    with smtp_server() as mailbox, _smtp(mailbox.port):
        tasks.process_events()
        assert mailbox.messages == []
    (event,) = _payouts()
    assert (event.state, event.email_state) == (Event.State.DONE, Event.EmailState.SKIPPED)
    assert not WebhookDelivery.objects.exists()
