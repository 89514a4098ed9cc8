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


def version_number(version: str) -> int:
    """``major * 10000 + minor`` of a "12.4"-like version, for comparing in SQL (0: unknown).
    Parts past 9999 are capped: no real CUDA or driver numbers get near."""
    key = version_key(version)
    if key == (-1,):
        return 0
    major, minor = key[0], key[1] if len(key) > 1 else 0
    return min(major, 9999) * 10000 + min(minor, 9999)
