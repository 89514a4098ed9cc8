"""``{% load money %}``: ``{{ entry.amount_micros|money }}`` -> $1.234567,
``{{ balance|cents }}`` -> $1.23."""

from __future__ import annotations

from django import template

from hub.billing.money import format_micros

register = template.Library()


@register.filter
def money(micros: int | None) -> str:
    return "" if micros is None else format_micros(micros)


@register.filter
def cents(micros: int | None) -> str:
    return "" if micros is None else format_micros(micros, cents=True)
