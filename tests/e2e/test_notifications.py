"""Issue 36 end to end: events reach a real SMTP server (aiosmtpd) and a real HTTP receiver
through the hub's own Celery worker and beat: signed, retried after 500s and timeouts, one
slow endpoint holding up nobody, a private address refused, a burst coalesced, a test event
posted signed and tried once."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from email.message import EmailMessage

import pytest
from django.test import override_settings

from hub.notifications import endpoints, signing
from hub.notifications.events import emit
from hub.notifications.kinds import TEST_KIND
from hub.notifications.models import Event, WebhookDelivery, WebhookEndpoint
from tests.hub import factories as f
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for
from tests.support.smtp_server import Mailbox, smtp_server
from tests.support.webhook_receiver import webhook_receiver

# One hub for the module (the mailbox fixture): its tests run on one xdist worker.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("notifications-e2e")]

TIMEOUT_S = 2
COALESCE_S = 2


def _settings(smtp_port: int) -> dict[str, str]:
    return {
        "EMAIL_BACKEND": "django.core.mail.backends.smtp.EmailBackend",
        "EMAIL_HOST": "127.0.0.1",
        "EMAIL_PORT": str(smtp_port),
        "DEFAULT_FROM_EMAIL": "CloudGPU <notices@cloudgpu.test>",
        "NOTIFY_COALESCE_S": str(COALESCE_S),
        "NOTIFY_SWEEP_S": "1",
        "WEBHOOK_RETRY_BASE_S": "1",
        "WEBHOOK_TIMEOUT_S": str(TIMEOUT_S),
        "WEBHOOK_ALLOW_LOOPBACK": "1",
    }


@pytest.fixture(scope="module")
def mailbox(tmp_path_factory: pytest.TempPathFactory, django_db_setup: None) -> Iterator[Mailbox]:
    """One SMTP server and one hub (web, worker, beat) for the module: each test tells its
    mail and deliveries apart by its own accounts and receiver."""
    with smtp_server() as box, hub_stack(tmp_path_factory.mktemp("notify"), **_settings(box.port)):
        yield box


def _mail(mailbox: Mailbox, to: str, title: str) -> list[EmailMessage]:
    """The mail of one kind (by its title) to ``to``: adding an endpoint mails its notice too."""
    return [m for m in mailbox.to(to) if title in str(m["Subject"])]


def _delivered(endpoint: WebhookEndpoint) -> WebhookDelivery | None:
    return WebhookDelivery.objects.filter(
        endpoint=endpoint, state=WebhookDelivery.State.DELIVERED
    ).first()


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_an_event_is_emailed_and_posted_signed_and_retried(mailbox: Mailbox) -> None:
    user = f.make_user("renter", email="renter@example.test")
    with webhook_receiver() as receiver:
        # Subscribed to the one kind: adding an endpoint is itself a (security) event.
        ok = endpoints.add(user, receiver.url("/ok"), "mine", kinds=["security.ssh_key_added"])
        flaky = endpoints.add(
            user, receiver.url("/fail-2"), "flaky", kinds=["security.ssh_key_added"]
        )
        other_kind = endpoints.add(user, receiver.url("/ok-other"), kinds=["rental.ended"])
        emit(
            user.pk,
            "security.ssh_key_added",
            {"fingerprint": "SHA256:abc", "comment": "laptop"},
        )
        mail = wait_for(
            lambda: _mail(mailbox, user.email, "New SSH key"), timeout_s=60, what="the email"
        )[0]
        wait_for(lambda: _delivered(ok), timeout_s=60, what="the webhook")
        wait_for(lambda: _delivered(flaky), timeout_s=60, what="the webhook after two 500s")
    event = Event.objects.get(account=user, kind="security.ssh_key_added")
    # The email: both parts, the event's words, no unsubscribe (a security notice is always
    # sent), marked as automatic.
    assert "New SSH key" in mail["Subject"]
    text = mail.get_body(preferencelist=("plain",)).get_content()
    html = mail.get_body(preferencelist=("html",)).get_content()
    assert "SHA256:abc" in text
    assert "SHA256:abc" in html
    assert mail["List-Unsubscribe"] is None
    assert mail["Auto-Submitted"] == "auto-generated"
    assert event.email_state == Event.EmailState.SENT
    # The webhook: the event's id and type, a signature its secret verifies, and a body that
    # any change breaks.
    (got,) = receiver.at("/ok")
    document = json.loads(got.body)
    assert document["id"] == str(event.id) == got.headers["cloudgpu-event-id"]
    assert document["type"] == "security.ssh_key_added"
    assert document["data"] == {"fingerprint": "SHA256:abc", "comment": "laptop"}
    header = got.headers[signing.SIGNATURE_HEADER.lower()]
    ok.refresh_from_db()
    assert signing.verify(ok.secret, header, got.body, now=int(time.time()))
    assert not signing.verify(flaky.secret, header, got.body, now=int(time.time()))
    assert not signing.verify(
        ok.secret, header, got.body.replace(b"abc", b"abd"), now=int(time.time())
    )
    assert ok.secret not in got.body.decode()
    assert ok.secret not in text
    # Retried after two 500s, the same event each time.
    tries = receiver.at("/fail-2")
    assert len(tries) == 3
    assert {json.loads(t.body)["id"] for t in tries} == {str(event.id)}
    flaky_delivery = _delivered(flaky)
    assert flaky_delivery is not None
    assert flaky_delivery.attempts == 3
    # An endpoint subscribed to other kinds got nothing.
    assert receiver.at("/ok-other") == []
    assert not WebhookDelivery.objects.filter(endpoint=other_kind).exists()


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_hanging_endpoint_delays_no_other_and_times_out(mailbox: Mailbox) -> None:
    user = f.make_user("supplier", email="")
    with webhook_receiver() as receiver:
        hanging = endpoints.add(user, receiver.url("/hang"), kinds=["payout.paid"])
        fine = endpoints.add(user, receiver.url("/ok"), kinds=["payout.paid"])
        emit(user.pk, "payout.paid", {"payout": "7", "amount": "12.00"})
        # The fine endpoint has its request while the other still hangs (the two posts go out
        # together, so either may reach the receiver first).
        wait_for(
            lambda: receiver.at("/ok") and receiver.hanging == 1,
            timeout_s=60,
            what="the fine endpoint's post with the other one held",
        )
        failed_once = wait_for(
            lambda: WebhookDelivery.objects.filter(endpoint=hanging, attempts__gte=1).first(),
            timeout_s=60,
            what="the hanging endpoint's attempt to end",
        )
        receiver.release()
        wait_for(lambda: _delivered(hanging), timeout_s=60, what="the retry")
    assert failed_once.last_error == f"no answer within {TIMEOUT_S} s"
    assert failed_once.last_status is None
    assert _delivered(fine) is not None
    assert not [m for m in mailbox.messages if "Payout paid" in m["Subject"]]  # no address


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_private_address_is_never_posted_to(mailbox: Mailbox) -> None:
    user = f.make_user("renter")
    # Saved around the form's check, as a row changed by hand would be: the delivery checks
    # again, against what the name resolves to then.
    private = WebhookEndpoint.objects.create(
        account=user, url="https://10.9.8.7/hook", secret=signing.new_secret()
    )
    emit(user.pk, "topup.credited", {"amount": "5.00", "balance": "5.00"})
    tried = wait_for(
        lambda: WebhookDelivery.objects.filter(endpoint=private, attempts__gte=1).first(),
        timeout_s=60,
        what="the delivery's first attempt",
    )
    assert tried.state == WebhookDelivery.State.PENDING
    assert (
        tried.last_error == "refused: webhooks cannot go to a private or reserved address: 10.9.8.7"
    )


# The window is the emitting process's setting: here, this one's (the hub's is the same).
@override_settings(WEBHOOK_ALLOW_LOOPBACK=True, NOTIFY_COALESCE_S=COALESCE_S)
def test_a_fleet_going_offline_is_one_email_and_one_webhook(mailbox: Mailbox) -> None:
    supplier = f.make_user("supplier", email="fleet@example.test")
    bystander = f.make_user("supplier", email="other@example.test")
    with webhook_receiver() as receiver:
        endpoints.add(supplier, receiver.url("/ok"), kinds=["host.offline"])
        for n in range(40):
            emit(supplier.pk, "host.offline", {"host": str(n), "name": f"rig-{n}", "at": "now"})
        emit(bystander.pk, "host.offline", {"host": "99", "name": "lonely", "at": "now"})
        wait_for(lambda: receiver.at("/ok"), timeout_s=60, what="the coalesced webhook")
        wait_for(lambda: mailbox.to(bystander.email), timeout_s=60, what="the other's mail")
        (mail,) = wait_for(
            lambda: _mail(mailbox, supplier.email, "Host offline"), timeout_s=60, what="the mail"
        )
        # Nothing more follows for the burst.
        wait_for(
            lambda: not Event.objects.filter(state=Event.State.PENDING).exists(),
            timeout_s=60,
            what="every event done",
        )
    assert len(receiver.at("/ok")) == 1
    assert len(_mail(mailbox, supplier.email, "Host offline")) == 1
    data = json.loads(receiver.at("/ok")[0].body)["data"]
    assert data["count"] == 40
    assert [item["name"] for item in data["items"]] == [f"rig-{n}" for n in range(40)]
    assert "(40)" in mail["Subject"]
    text = mail.get_body(preferencelist=("plain",)).get_content()
    assert "rig-0" in text
    assert "rig-39" in text
    assert "lonely" not in text


@override_settings(WEBHOOK_ALLOW_LOOPBACK=True)
def test_a_test_event_is_posted_signed_and_tried_once(mailbox: Mailbox) -> None:
    user = f.make_user("renter", email="")
    with webhook_receiver() as receiver:
        fine = endpoints.add(user, receiver.url("/ok"), kinds=["payout.paid"])
        down = endpoints.add(user, receiver.url("/always-500"), kinds=["payout.paid"])
        endpoints.send_test(fine)
        endpoints.send_test(down)
        (got,) = wait_for(
            lambda: receiver.at("/ok", kind=TEST_KIND), timeout_s=60, what="the test event"
        )
        failed = wait_for(
            lambda: WebhookDelivery.objects.filter(endpoint=down, state="failed").first(),
            timeout_s=60,
            what="the test to the failing receiver to be tried",
        )
        # Tried: another test may go at once, and it too is tried once.
        endpoints.send_test(down)
        wait_for(
            lambda: WebhookDelivery.objects.filter(endpoint=down, state="failed").count() == 2,
            timeout_s=60,
            what="the second test to be tried",
        )
        assert len(receiver.at("/always-500", kind=TEST_KIND)) == 2
    document = json.loads(got.body)
    assert (document["type"], document["data"]["endpoint"]) == (TEST_KIND, fine.pk)
    header = got.headers[signing.SIGNATURE_HEADER.lower()]
    assert signing.verify(fine.secret, header, got.body, now=int(time.time()))
    assert (failed.attempts, failed.last_status, failed.last_error) == (1, 500, "answered 500")
    assert _delivered(fine) is not None
