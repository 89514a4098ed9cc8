"""Rules for the tests themselves that a reviewer keeps missing.

``asyncio.run()`` in a plain test closes the thread's event loop and sets a new one, orphaning
pytest-asyncio's: that loop's self-pipe (an AF_UNIX socket pair) is then reported unclosed by
whichever later test happens to trigger a collection, far from the cause. Plain tests use
tests/support/loops.py's ``run_on_own_loop`` instead."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ALLOWED = {TESTS / "support" / "loops.py", Path(__file__).resolve()}


def test_no_test_calls_asyncio_run() -> None:
    offenders = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in sorted(TESTS.rglob("*.py"))
        if path not in ALLOWED
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"\basyncio\.run\(", line) and not line.lstrip().startswith("#")
    ]
    assert offenders == [], f"use tests.support.loops.run_on_own_loop: {offenders}"
