"""The wait before a failed email's or webhook's next attempt: one schedule shape for both."""

from __future__ import annotations

import random
from datetime import timedelta


def delay(attempts: int, steps: tuple[int, ...], base_s: float) -> timedelta:
    """The ``attempts``-th failure waits ``steps[attempts-1] * base_s`` (the last step repeats),
    spread by ±10 % so a burst of failures does not retry at one instant."""
    step = steps[min(attempts, len(steps)) - 1]
    return timedelta(seconds=step * base_s * random.uniform(0.9, 1.1))  # noqa: S311
