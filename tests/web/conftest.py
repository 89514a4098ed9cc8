"""Browser tests: Playwright (Python) driving Debian's chromium against a live hub."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from tests.support.processes import REPO_ROOT

CHROMIUM = Path(os.environ.get("CLOUDGPU_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOTS = REPO_ROOT / ".state" / "artifacts" / "screenshots"


def _unavailable(reason: str) -> None:
    if os.environ.get("CLOUDGPU_REQUIRE_BROWSER") == "1":
        pytest.fail(f"CLOUDGPU_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def browser(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """One chromium per test, started after the test database and stopped before its flush.

    Playwright's sync API keeps an asyncio loop on this thread between calls, so Django would
    refuse the test body's ORM calls; the test body itself is plain sync code."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright package is not installed (requirements/dev.txt)")
    if not CHROMIUM.is_file():
        _unavailable(f"{CHROMIUM} is missing (apt-get install chromium)")
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()
            # With Playwright's loop on this thread, asgiref keeps the test body's database
            # connection apart from the one pytest-django flushes with: close it here, or the
            # test database cannot be dropped at the end.
            connections.close_all()


@pytest.fixture
def screenshot() -> Any:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def take(page: Any, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
