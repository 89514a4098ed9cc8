"""`make run` as a newcomer meets it (issue 20 items 10 and 11): the passwords in the closing
summary, no child process's banner on the terminal, the hub's own 404 page (DEBUG off) with its
stylesheet served by the hub, and a sign-in with the password the summary gave."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.hub.test_runner import _PASSWORD, runner
from tests.support.polling import wait_for

SUMMARY = "CloudGPU hub is running:"


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def test_make_run_ends_with_the_passwords_and_serves_real_error_pages(
    browser: Any, screenshot: Any, state_dir: Path
) -> None:
    with runner(state_dir, HUB_DEMO_AGENT="0", HUB_DEMO_GATEWAY="0") as run:
        wait_for(lambda: "Press Ctrl-C" in run.text(), timeout_s=60, what="the runner's summary")
        before, _, summary = run.text().partition(SUMMARY)
        # The passwords are at the end, where they do not scroll away, and only there.
        passwords = dict(_PASSWORD.findall(summary))
        assert set(passwords) == {"admin", "renter", "supplier"}
        assert _PASSWORD.findall(before) == []
        assert "shown on this run only" in summary
        # Celery's and Daphne's banners went to their logs.
        for banner in ("celery@", "[tasks]", "beat: Starting", "Listening on TCP address"):
            assert banner not in run.text(), f"{banner!r} reached the terminal"
        worker_log = state_dir / "worker.log"
        wait_for(
            lambda: worker_log.exists() and "celery@" in worker_log.read_text(errors="replace"),
            timeout_s=60,
            what="the worker's banner in worker.log",
        )

        page = browser.new_page()
        missing = page.goto(f"{run.base_url}/no-such-page/")
        assert missing is not None
        assert missing.status == 404
        _expect()(page.locator("body")).to_contain_text("There is nothing at this address.")
        # Not Django's debug page, which lists every URL pattern of the hub.
        assert "URLconf" not in page.content()
        assert "Page not found" not in page.content()
        screenshot(page, "local-trial-404")
        page.get_by_role("link", name="Go to the dashboard").click()

        # The stylesheet comes from the hub itself (WhiteNoise) with DEBUG off.
        with page.expect_response(lambda r: "/static/web/app.css" in r.url) as styles:
            page.goto(f"{run.base_url}/login/")
        assert styles.value.status == 200
        page.fill("#id_username", "renter")
        page.fill("#id_password", passwords["renter"])
        page.click("button[type=submit]")
        _expect()(page.get_by_role("button", name="Log out")).to_be_visible()
        screenshot(page, "local-trial-signed-in")
