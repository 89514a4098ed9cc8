"""Money as integer micro-units (1 unit = 1,000,000 micros), and how it is shown to people.

Django-free on purpose: pages, admin, CLI and e-mails all format money the same way.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

MICROS_PER_UNIT = 1_000_000
MICROS_PER_CENT = 10_000
SYMBOL = "$"


def format_micros(micros: int, *, cents: bool = False, symbol: str = SYMBOL) -> str:
    """``1_234_567`` -> ``"$1.234567"``, or ``"$1.23"`` with ``cents`` (half away from zero)."""
    magnitude = abs(int(micros))
    if cents:
        whole_cents = (magnitude + MICROS_PER_CENT // 2) // MICROS_PER_CENT
        sign = "-" if micros < 0 and whole_cents else ""
        return f"{sign}{symbol}{whole_cents // 100:,}.{whole_cents % 100:02d}"
    sign = "-" if micros < 0 else ""
    return f"{sign}{symbol}{magnitude // MICROS_PER_UNIT:,}.{magnitude % MICROS_PER_UNIT:06d}"


def micros_from_units(amount: Decimal | str | int) -> int:
    """``Decimal("1.5")`` -> ``1_500_000``; more than six decimal places is refused, never
    rounded, so that what an admin typed is exactly what the ledger holds."""
    try:
        value = Decimal(str(amount)) if not isinstance(amount, Decimal) else amount
    except InvalidOperation:
        raise ValueError(f"not an amount: {amount!r}") from None
    if not value.is_finite():
        raise ValueError(f"not an amount: {amount!r}")
    micros = value * MICROS_PER_UNIT
    if micros != micros.to_integral_value():
        raise ValueError("amounts have at most six decimal places")
    return int(micros)
