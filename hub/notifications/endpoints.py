"""An account's webhook endpoints: add (told to the account as a security notice), change,
rotate the secret, remove, send a test."""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser
from django.db import transaction
from django.utils import timezone

from hub.celery import app as celery_app
from hub.notifications import addresses, signing
from hub.notifications.events import emit
from hub.notifications.kinds import KINDS, TEST_KIND
from hub.notifications.models import Event, WebhookDelivery, WebhookEndpoint
from hub.notifications.tasks import DELIVER_TASK

MAX_ENDPOINTS = 10


class EndpointError(ValueError):
    """A request about an endpoint that cannot be done; the message says why."""


def _kinds(kinds: Iterable[str]) -> list[str]:
    chosen = sorted(set(kinds))
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise EndpointError(f"unknown event kinds: {', '.join(unknown)}")
    return chosen


def add(
    user: AbstractUser, url: str, description: str = "", kinds: Iterable[str] = ()
) -> WebhookEndpoint:
    url = url.strip()
    try:
        addresses.check_url(url)
    except addresses.EndpointRefused as exc:
        raise EndpointError(str(exc)) from None
    with transaction.atomic():
        # Locks the account's row: two adds at once cannot both pass the count.
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
        if WebhookEndpoint.objects.filter(account=user).count() >= MAX_ENDPOINTS:
            raise EndpointError(f"an account has at most {MAX_ENDPOINTS} webhook endpoints")
        endpoint = WebhookEndpoint.objects.create(
            account=user,
            url=url,
            description=description.strip()[:100],
            kinds=_kinds(kinds),
            secret=signing.new_secret(),
        )
        # An endpoint receives every event of the account: one added by someone else (a
        # stolen session) is as much a way in as a new token. The host only: a webhook URL's
        # path or query often holds the receiver's own key.
        emit(
            user.pk,
            "security.webhook_added",
            {
                "endpoint": endpoint.pk,
                "host": urlsplit(url).hostname or "?",
                "kinds": endpoint.kinds or "every kind",
            },
        )
    return endpoint


def update(
    endpoint: WebhookEndpoint, *, kinds: Iterable[str], enabled: bool, description: str
) -> None:
    endpoint.kinds = _kinds(kinds)
    endpoint.enabled = enabled
    endpoint.description = description.strip()[:100]
    endpoint.save(update_fields=["kinds", "enabled", "description"])


def rotate_secret(endpoint: WebhookEndpoint) -> str:
    endpoint.secret = signing.new_secret()
    endpoint.save(update_fields=["secret"])
    return endpoint.secret


def send_test(endpoint: WebhookEndpoint) -> WebhookDelivery:
    """A ``webhook.test`` event for this endpoint alone, posted by the worker's next run and
    tried once (no retries): its answer shows in the delivery log."""
    if not endpoint.enabled:
        raise EndpointError("this endpoint is disabled: enable it to send a test event")
    now = timezone.now()
    with transaction.atomic():
        # One at a time: a script pressing the button cannot queue a backlog that would take
        # every batch's places of this endpoint. A test is pending only until its one try.
        waiting = WebhookDelivery.objects.filter(
            endpoint=endpoint, event__kind=TEST_KIND, state=WebhookDelivery.State.PENDING
        )
        if waiting.exists():
            raise EndpointError(
                "a test event is already on its way to this endpoint: its result shows in the "
                "delivery log within seconds"
            )
        event = Event.objects.create(
            account=endpoint.account,
            kind=TEST_KIND,
            data={
                "message": "A test event from your CloudGPU account page.",
                "endpoint": endpoint.pk,
            },
            due_at=now,
            state=Event.State.DONE,
            done_at=now,
            webhooks_made=True,
            email_state=Event.EmailState.SKIPPED,
        )
        made = WebhookDelivery.objects.create(event=event, endpoint=endpoint, next_attempt_at=now)
        transaction.on_commit(
            lambda: celery_app.send_task(DELIVER_TASK, ignore_result=True), robust=True
        )
    return made
