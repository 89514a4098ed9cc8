"""Money as integer micro-units (1 unit = 1,000,000 micros), and how it is shown to people:
amounts and balances in cents (``format_micros(..., cents=True)``), rates with the digits they
need (``format_rate``); the six-digit form is for the ledger's exact figures and the API.

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


def format_rate(micros: int, *, symbol: str = SYMBOL) -> str:
    """A price or a per-minute need, as people read it: cents when it is whole cents
    (``1_500_000`` -> ``"$1.50"``), else only the digits it needs (``25_000`` -> ``"$0.025"``,
    never ``"$0.025000"``), so a sub-cent rate is neither hidden as $0.00 nor padded."""
    if int(micros) % MICROS_PER_CENT == 0:
        return format_micros(micros, cents=True, symbol=symbol)
    exact = format_micros(micros, symbol=symbol)
    return exact.rstrip("0")


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
