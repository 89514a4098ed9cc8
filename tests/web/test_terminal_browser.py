"""A renter's terminal in a real browser (Debian's chromium) against a live hub and a real agent
with the Docker runtime: from the lease page's link, run a command, see its output, resize the
window, interrupt a program with Ctrl-C, all under the page's Content-Security-Policy."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from hub.accounts.models import User
from tests.support import terminal_page
from tests.support.control_plane import lease_state, start_lease
from tests.support.docker_agent import docker_agent_online
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

PASSWORD = "correct-Horse-battery-9"
TIMEOUT_MS = 45_000


def test_a_renter_runs_commands_in_their_rental_from_the_browser(
    browser: Any, tmp_path: Path, busybox_image: str, docker_client: Any, screenshot: Any
) -> None:
    from playwright.sync_api import expect

    supplier = User.objects.create_user(f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(f"renter-{uuid.uuid4().hex[:6]}", password=PASSWORD)
    (tmp_path / "hub").mkdir()
    with (
        hub_stack(tmp_path / "hub") as stack,
        docker_agent_online(stack, tmp_path, supplier) as host,
    ):
        lease_id = start_lease(
            stack, renter, host, "--image", busybox_image, "--command", "sleep", "3600"
        )
        lease = wait_for(
            lambda: lease_state(lease_id, "running", "failed"), timeout_s=120, what="running"
        )
        assert lease.state == "running", lease.failure_reason
        context = browser.new_context(viewport={"width": 1200, "height": 800})
        page = context.new_page()
        blocked: list[str] = []
        context.on(
            "console",
            lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None,
        )
        page.goto(f"{stack.url()}/login/")
        page.fill("#id_username", renter.username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.goto(f"{stack.url()}/leases/{lease_id}/")
        with context.expect_page() as opened:
            page.click("#open-terminal")
        terminal = opened.value
        terminal.on(
            "console",
            lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None,
        )
        expect(terminal.locator("#terminal-status")).to_have_text("Connected.", timeout=TIMEOUT_MS)
        terminal_page.runs_a_command(terminal)
        terminal_page.resizes(terminal)
        container = docker_client.containers.list(filters={"label": f"cloudgpu.lease={lease_id}"})[
            0
        ]
        terminal_page.ctrl_c_interrupts(terminal, container)
        screenshot(terminal, "terminal")
        terminal.keyboard.type("exit 4\n")
        expect(terminal.locator("#terminal-status")).to_contain_text(
            "exit code 4", timeout=TIMEOUT_MS
        )
        assert blocked == []
        context.close()
        stack.manage("hub", "lease", "release", lease_id)
        wait_for(lambda: lease_state(lease_id, "ended"), timeout_s=60, what="ended")
