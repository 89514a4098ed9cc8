"""Rules for the tests themselves that a reviewer keeps missing.

``asyncio.run()`` in a plain test closes the thread's event loop and sets a new one, orphaning
pytest-asyncio's: that loop's self-pipe (an AF_UNIX socket pair) is then reported unclosed by
whichever later test happens to trigger a collection, far from the cause. Plain tests use
tests/support/loops.py's ``run_on_own_loop`` instead. The hub's own code runs in the test
process too (its tasks and services are called directly), so it may not call it either."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HUB = TESTS.parent / "hub"
ALLOWED = {TESTS / "support" / "loops.py", Path(__file__).resolve()}


def _calls(folder: Path) -> list[str]:
    return [
        f"{path.relative_to(folder.parent)}:{number}"
        for path in sorted(folder.rglob("*.py"))
        if path not in ALLOWED
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if re.search(r"\basyncio\.run\(", line) and not line.lstrip().startswith("#")
    ]


def test_no_test_calls_asyncio_run() -> None:
    offenders = _calls(TESTS)
    assert offenders == [], f"use tests.support.loops.run_on_own_loop: {offenders}"


def test_no_hub_code_calls_asyncio_run() -> None:
    # hub/notifications/delivery.py did: a services test that delivered webhooks in-process
    # left pytest-asyncio's loop to be reported by a later, unrelated test.
    offenders = _calls(HUB)
    assert offenders == [], f"use asyncio.Runner(loop_factory=asyncio.new_event_loop): {offenders}"
