"""Each event's email, through Django's email framework (EMAIL_BACKEND: the console under
`make run`, SMTP in production), in plain text and HTML, with a one-click unsubscribe link
(RFC 8058 headers, so mail clients offer it too) except on security notices, which cannot be
turned off. No secret is ever in a mail: events carry ids, names and amounts, a token's notice
names only its prefix and an endpoint's only its host (a webhook URL's path may hold a key)."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.core import signing
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string

from hub.notifications import wording
from hub.notifications.kinds import KINDS
from hub.notifications.models import Event, NotificationSettings

UNSUBSCRIBE_SALT = "notifications.unsubscribe"
SETTINGS_PATH = "/account/notifications/"


def unsubscribe_token(user_id: int, kind: str) -> str:
    return signing.dumps({"u": user_id, "k": kind}, salt=UNSUBSCRIBE_SALT, compress=True)


def read_unsubscribe_token(token: str) -> tuple[int, str] | None:
    """(user id, kind), or None for a token this hub did not sign or a kind it no longer has."""
    try:
        value = signing.loads(token, salt=UNSUBSCRIBE_SALT)
    except signing.BadSignature:
        return None
    if not isinstance(value, dict):
        return None
    user_id, kind = value.get("u"), value.get("k")
    if not isinstance(user_id, int) or kind not in KINDS:
        return None
    return user_id, kind


def wanted(user: AbstractUser, kind: str) -> bool:
    if not user.email or not user.is_active:
        return False
    if not KINDS[kind].can_mute:
        return True  # even if muted before security notices could not be
    prefs = NotificationSettings.objects.filter(user=user).first()
    return prefs is None or kind not in prefs.email_muted


def message(event: Event, user: AbstractUser) -> EmailMultiAlternatives:
    base = settings.HUB_PUBLIC_URL
    can_mute = KINDS[event.kind].can_mute
    unsubscribe_url = f"{base}/notifications/unsubscribe/{unsubscribe_token(user.pk, event.kind)}/"
    headers = {
        # RFC 3834: no auto-replies (vacation notices) to the sender.
        "Auto-Submitted": "auto-generated",
        "X-CloudGPU-Event-Id": str(event.id),
        "X-CloudGPU-Event-Type": event.kind,
    }
    if can_mute:
        headers |= {
            "List-Unsubscribe": f"<{unsubscribe_url}>",
            "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
        }
    context = {
        "user": user,
        "subject": wording.subject(event),
        "title": KINDS[event.kind].title,
        "lines": wording.lines(event),
        "page_url": base + wording.page(event),
        "unsubscribe_url": unsubscribe_url if can_mute else "",
        "settings_url": base + SETTINGS_PATH,
    }
    mail = EmailMultiAlternatives(
        subject=context["subject"],
        body=render_to_string("notifications/email.txt", context),
        to=[user.email],
        headers=headers,
    )
    mail.attach_alternative(render_to_string("notifications/email.html", context), "text/html")
    return mail
