"""The local trial (`make run`'s runner: embedded Postgres and Redis, the gateway, the demo agent
with the Docker runtime) as a newcomer meets it in a real browser (Debian's chromium): sign in as
the demo renter, rent the demo GPU from its form, click the rental's URL, and use its terminal:
a command, a resize, Ctrl-C (issue 17's browser test)."""

from __future__ import annotations

import shlex
import uuid
from typing import Any

from hub.lib.ports import free_port
from tests.hub.test_runner import _clone_state_under_tmp, _demo_passwords, runner
from tests.support import terminal_page
from tests.support.gateway import require_gateway
from tests.support.polling import wait_for

TIMEOUT_MS = 120_000


def test_a_newcomer_rents_in_the_local_trial_and_uses_the_url_and_the_terminal(
    browser: Any, busybox_image: str, docker_client: Any, screenshot: Any
) -> None:
    from playwright.sync_api import expect

    require_gateway()
    ssh_port, http_port = free_port(), free_port()
    ports = {"HUB_GATEWAY_SSH_PORT": str(ssh_port), "HUB_GATEWAY_HTTP_PORT": str(http_port)}
    with _clone_state_under_tmp() as state, runner(state, **ports) as run:
        wait_for(lambda: "Press Ctrl-C" in run.text(), timeout_s=60, what="the runner's summary")
        context = browser.new_context(viewport={"width": 1200, "height": 800})
        page = context.new_page()
        page.goto(f"{run.base_url}/login/")
        page.fill("#id_username", "renter")
        page.fill("#id_password", _demo_passwords(run)["renter"])
        page.click("button[type=submit]")

        # The demo agent's GPU shows up among the offers once it has registered.
        def offered() -> bool:
            page.goto(f"{run.base_url}/offers/")
            return bool(page.locator("#offers a.button", has_text="Rent").count())

        wait_for(offered, timeout_s=90, interval_s=1, what="the demo GPU offered")
        page.locator("#offers a.button", has_text="Rent").first.click()
        marker = uuid.uuid4().hex
        serve = f"mkdir /www; echo {marker} > /www/index.html; exec httpd -f -p 8080 -h /www"
        page.fill("#id_image", busybox_image)
        page.fill("#id_ports", "8080")
        page.fill("#id_command", shlex.join(["sh", "-c", serve]))
        page.click("#rent-form button[type=submit]")
        page.wait_for_url("**/leases/*/", timeout=30_000)
        lease_id = page.url.rstrip("/").rsplit("/", 1)[-1]

        # Running, its URL up (the page updates itself), and the URL answers when clicked.
        link = page.locator("a.lease-url")
        expect(link).to_be_visible(timeout=TIMEOUT_MS)
        expect(page.locator(".tunnel-not-up")).to_have_count(0, timeout=TIMEOUT_MS)
        assert link.inner_text().endswith(f".localhost:{http_port}/")
        with context.expect_page() as opened:
            link.click()
        site = opened.value
        expect(site.locator("body")).to_contain_text(marker, timeout=30_000)
        screenshot(page, "local-trial-lease")

        with context.expect_page() as opened:
            page.click("#open-terminal")
        terminal = opened.value
        expect(terminal.locator("#terminal-status")).to_have_text("Connected.", timeout=60_000)
        expect(terminal.locator("#terminal-latency")).to_contain_text(
            "round trip to the host", timeout=30_000
        )
        terminal_page.runs_a_command(terminal)
        terminal_page.resizes(terminal)
        container = docker_client.containers.list(filters={"label": f"cloudgpu.lease={lease_id}"})[
            0
        ]
        terminal_page.ctrl_c_interrupts(terminal, container)
        screenshot(terminal, "local-trial-terminal")
        context.close()
