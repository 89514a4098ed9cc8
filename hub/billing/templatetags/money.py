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
