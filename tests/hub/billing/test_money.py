from __future__ import annotations

from decimal import Decimal

import pytest
from django.template import Context, Template

from hub.billing.money import format_micros, format_rate, micros_from_units


@pytest.mark.parametrize(
    ("micros", "full", "cents"),
    [
        (0, "$0.000000", "$0.00"),
        (1_234_567, "$1.234567", "$1.23"),
        (1_235_000, "$1.235000", "$1.24"),  # half a cent rounds away from zero
        (-90_000, "-$0.090000", "-$0.09"),
        (-4_999, "-$0.004999", "$0.00"),  # no "-$0.00"
        (1_234_567_890_123, "$1,234,567.890123", "$1,234,567.89"),
    ],
)
def test_micros_are_shown_in_full_or_in_cents(micros: int, full: str, cents: str) -> None:
    assert format_micros(micros) == full
    assert format_micros(micros, cents=True) == cents


@pytest.mark.parametrize(
    ("micros", "shown"),
    [
        (0, "$0.00"),
        (1_500_000, "$1.50"),
        (25_000, "$0.025"),  # the out-of-funds message's first minute, not "$0.025000"
        (4_166, "$0.004166"),
        (-10_000, "-$0.01"),
        (-4_999, "-$0.004999"),
        (1_234_567_890_120, "$1,234,567.89012"),
    ],
)
def test_rates_show_cents_or_only_the_digits_they_need(micros: int, shown: str) -> None:
    assert format_rate(micros) == shown


def test_units_become_micros_exactly() -> None:
    assert micros_from_units(Decimal("3.60")) == 3_600_000
    assert micros_from_units("-0.000001") == -1
    with pytest.raises(ValueError, match="six decimal places"):
        micros_from_units("0.0000001")
    with pytest.raises(ValueError, match="not an amount"):
        micros_from_units("ten")


def test_template_filters() -> None:
    rendered = Template("{% load money %}{{ a|money }} {{ a|cents }} {{ b|rate }}").render(
        Context({"a": 1_234_567, "b": 2_500_000})
    )
    assert rendered == "$1.234567 $1.23 $2.50"
