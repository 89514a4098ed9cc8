"""``{% load money %}``: ``{{ entry.amount_micros|money }}`` -> $1.234567 or $1.50,
``{{ balance|cents }}`` -> $1.23, ``{{ price|rate }}`` -> $1.50 or $0.025 (digits only where a rate
needs them)."""

from __future__ import annotations

from django import template

from hub.billing.money import format_micros, format_rate

register = template.Library()


@register.filter
def money(micros: int | None) -> str:
    # Exact, without padding: the ledger's figures (a charge of $0.004166 stays visible).
    return "" if micros is None else format_rate(micros)


@register.filter
def cents(micros: int | None) -> str:
    return "" if micros is None else format_micros(micros, cents=True)


@register.filter
def rate(micros: int | None) -> str:
    return "" if micros is None else format_rate(micros)


@register.filter
def units(micros: int | None) -> str:
    """For a form's number input: ``1_500_000`` -> ``1.50``, ``4_000`` -> ``0.004`` (a sub-cent
    price must not be shown, and saved back, as 0.00)."""
    return "" if micros is None else format_rate(micros, symbol="")
