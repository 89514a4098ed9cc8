"""Comparing agent versions ("0.1.0", "1.2.3rc1") without a packaging dependency."""

from __future__ import annotations

import re

_NUMBERS = re.compile(r"^(\d+(?:\.\d+)*)")


def version_key(version: str) -> tuple[int, ...]:
    """The leading numeric part as a tuple; anything unparseable sorts before every release."""
    match = _NUMBERS.match(version.strip())
    if match is None:
        return (-1,)
    return tuple(int(part) for part in match.group(1).split("."))


def is_older(version: str, than: str) -> bool:
    return version_key(version) < version_key(than)
