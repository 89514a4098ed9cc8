"""The account page's forms, and the writes to an account's NotificationSettings row that the
page and the unsubscribe link make (the row is made on first save, with the defaults)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.conf import settings
from django.db import transaction

from hub.accounts.models import User
from hub.billing.money import format_rate, micros_from_units
from hub.notifications.kinds import KINDS
from hub.notifications.models import NotificationSettings

MAX_THRESHOLD_USD = Decimal(1_000_000)
KIND_CHOICES = [(k.name, k.title) for k in KINDS.values()]


def _defaults() -> dict[str, Any]:
    # A row made for another reason (email choices, an unsubscribe) must not switch the
    # low-balance notice off: an absent row means "the hub's default threshold".
    return {"low_balance_threshold_micros": settings.NOTIFY_LOW_BALANCE_DEFAULT_MICROS}


def threshold_micros(user: User) -> int | None:
    """The threshold in force: the account's own (None: off), else the hub's default."""
    prefs = NotificationSettings.objects.filter(user=user).first()
    if prefs is None:
        return int(settings.NOTIFY_LOW_BALANCE_DEFAULT_MICROS)
    return prefs.low_balance_threshold_micros


def muted_kinds(user: User) -> list[str]:
    prefs = NotificationSettings.objects.filter(user=user).first()
    return list(prefs.email_muted) if prefs else []


def mute_email(user: User, kind: str) -> None:
    """Stop emails of ``kind`` to ``user``; doing it twice (a mail client's one-click POST and
    then the person's) changes nothing. A security kind cannot be stopped."""
    if not KINDS[kind].can_mute:
        raise ValueError(f"{kind} emails cannot be turned off")
    with transaction.atomic():
        NotificationSettings.objects.get_or_create(user=user, defaults=_defaults())
        prefs = NotificationSettings.objects.select_for_update().get(user=user)
        if kind not in prefs.email_muted:
            prefs.email_muted = sorted([*prefs.email_muted, kind])
            prefs.save(update_fields=["email_muted"])


class UsdField(forms.DecimalField):
    """Dollars as people type them: "5", "12.50", "$1,000"."""

    def to_python(self, value: Any) -> Decimal | None:
        if isinstance(value, str):
            value = value.strip().removeprefix("$").replace(",", "").strip()
        return super().to_python(value)


class LowBalanceForm(forms.Form):
    threshold = UsdField(
        label="Tell me when my balance falls below (USD)",
        required=False,
        min_value=Decimal(0),
        max_value=MAX_THRESHOLD_USD,
        decimal_places=2,
        help_text="Blank: no low-balance notice.",
        error_messages={
            "invalid": "Enter an amount in dollars, such as 5 or 12.50.",
            "min_value": "The threshold cannot be negative.",
            "max_value": "The threshold can be at most $1,000,000.",
            "max_decimal_places": "Give the threshold in whole cents (at most 2 decimals).",
        },
        widget=forms.TextInput(attrs={"inputmode": "decimal", "autocomplete": "off"}),
    )

    @staticmethod
    def initial_for(user: User) -> dict[str, str]:
        micros = threshold_micros(user)
        return {"threshold": "" if micros is None else format_rate(micros, symbol="")}

    def save(self, user: User) -> int | None:
        value = self.cleaned_data["threshold"]
        micros = None if value is None else micros_from_units(value)
        NotificationSettings.objects.update_or_create(
            user=user, defaults={"low_balance_threshold_micros": micros}
        )
        return micros


class EmailForm(forms.Form):
    # The kinds left checked are emailed; the row keeps the ones left unchecked, so a kind added
    # later is emailed until its owner says otherwise. Security kinds are always emailed (their
    # boxes are shown ticked and disabled, so a browser sends nothing for them).
    emailed = forms.MultipleChoiceField(
        choices=KIND_CHOICES, required=False, widget=forms.CheckboxSelectMultiple
    )

    def save(self, user: User) -> list[str]:
        emailed = set(self.cleaned_data["emailed"])
        muted = [k.name for k in KINDS.values() if k.can_mute and k.name not in emailed]
        NotificationSettings.objects.update_or_create(
            user=user,
            defaults={"email_muted": muted},
            create_defaults={**_defaults(), "email_muted": muted},
        )
        return muted


class EndpointForm(forms.Form):
    # A plain CharField: endpoints.add checks the URL and says exactly what is wrong with it.
    url = forms.CharField(
        label="URL",
        max_length=500,
        widget=forms.TextInput(attrs={"placeholder": "https://example.com/hooks/cloudgpu"}),
    )
    description = forms.CharField(max_length=100, required=False)
    kinds = forms.MultipleChoiceField(
        choices=KIND_CHOICES, required=False, widget=forms.CheckboxSelectMultiple
    )


class EndpointUpdateForm(forms.Form):
    enabled = forms.BooleanField(required=False)
    description = forms.CharField(max_length=100, required=False)
    kinds = forms.MultipleChoiceField(
        choices=KIND_CHOICES, required=False, widget=forms.CheckboxSelectMultiple
    )
