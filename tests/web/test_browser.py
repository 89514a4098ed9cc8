"""The dashboard in a real browser against a live hub (Daphne, Celery worker and beat) with a
real mock-runtime agent: a renter's whole rental, and a supplier joining a host."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from hub.accounts.models import User
from hub.catalog.models import Template
from hub.leases.models import Lease
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Gpu, Host
from tests.support.agents import configure, running_agent
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct-Horse-battery-9"
LIVE_TIMEOUT_MS = 45_000


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def _tunnel_settings(tmp_path: Path) -> dict[str, str]:
    """Tunnels on, so that every port gets a URL (no gateway runs: the URLs stay down)."""
    key = tmp_path / "gateway_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    keys_file = tmp_path / "gateway_host_keys"
    keys_file.write_text(key.with_suffix(".pub").read_text())
    return {
        "TUNNEL_DOMAIN": "tunnels.test",
        "TUNNEL_GATEWAY_SSH_HOST": "127.0.0.1",
        "TUNNEL_GATEWAY_SSH_PORT": "9",
        "TUNNEL_GATEWAY_HOST_KEYS_FILE": str(keys_file),
        "BILLING_INTERVAL_S": "2",
    }


def _mark_page(page: Any) -> None:
    """A marker that a reload or navigation would wipe: live updates must keep it."""
    page.evaluate("window.__noReload = 'still here'")


def _assert_not_reloaded(page: Any) -> None:
    assert page.evaluate("window.__noReload") == "still here"


def _csp_violations(page: Any) -> list[str]:
    """What the browser refused under the Content-Security-Policy while ``page`` was open."""
    seen: list[str] = []
    page.on(
        "console",
        lambda message: seen.append(message.text)
        if "Content Security Policy" in message.text
        else None,
    )
    return seen


def _online_host(owner: User) -> Host | None:
    return Host.objects.filter(owner=owner, status=Host.Status.ONLINE).first()


def _sign_up(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/signup/")
    page.fill("#id_username", username)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")
    _expect()(page.locator(".messages")).to_contain_text(f"Welcome, {username}")


def _admin_top_up(context: Any, base: str, admin: str, renter: str, amount: str) -> None:
    page = context.new_page()
    blocked = _csp_violations(page)
    page.goto(f"{base}/admin/login/")
    page.fill("#id_username", admin)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.goto(f"{base}/admin/accounts/user/?q={renter}")
    page.locator("tr", has_text=renter).locator("input.action-select").check()
    page.select_option("select[name=action]", "adjust_balance")
    page.click("button[name=index]")
    page.fill("#id_amount", amount)
    page.fill("#id_reason", "browser test top-up")
    page.click("input[name=apply]")
    _expect()(page.locator(".messagelist")).to_contain_text("Adjusted the balance of 1 user")
    assert blocked == []  # the admin's own scripts run under the policy too
    page.close()


def test_a_renter_signs_up_rents_watches_it_run_stops_it_and_sees_the_cost(
    browser: Any, tmp_path: Path, screenshot: Any
) -> None:
    expect = _expect()
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    admin = User.objects.create_superuser(f"admin-{uuid.uuid4().hex[:6]}", password=PASSWORD)
    renter = f"renter-{uuid.uuid4().hex[:6]}"
    Template.objects.create(
        slug="web-demo", name="Web demo", image="busybox", ports=[8080], command=["httpd"]
    )
    with hub_stack(tmp_path, **_tunnel_settings(tmp_path)) as stack:
        _, token = supplier_services.create_agent_token(
            supplier, "rig", default_price_per_hour_micros=0
        )
        state = tmp_path / "agent"
        assert configure(state, stack.url(), token, "--runtime", "mock").returncode == 0
        with running_agent(state, tmp_path / "agent.log"):
            host = wait_for(lambda: _online_host(supplier), timeout_s=60, what="host online")
            gpu = Gpu.objects.get(host=host)
            # $360/h is 10 cents a second: a rental of a few seconds costs whole cents.
            supplier_services.set_gpu_terms(gpu.pk, price_per_hour_micros=360_000_000)

            context = browser.new_context(base_url=stack.url())
            page = context.new_page()
            page.set_default_timeout(20_000)
            blocked = _csp_violations(page)
            _sign_up(page, stack.url(), renter)
            screenshot(page, "offers")

            admin_context = browser.new_context(base_url=stack.url())
            _admin_top_up(admin_context, stack.url(), admin.username, renter, "100")
            admin_context.close()

            page.goto("/offers/?model=4090")
            row = page.locator(f'tr[data-gpu="{gpu.pk}"]')
            expect(row).to_contain_text("$360.00")
            expect(row).to_contain_text("24 GiB")
            row.get_by_role("link", name="Rent").click()
            page.select_option("#id_template", label="Web demo")
            page.fill("#id_keep_alive_hours", "2")
            screenshot(page, "rent")
            page.click("#rent-form button[type=submit]")
            expect(page).to_have_url(re.compile(r"/leases/[0-9a-f-]{36}/$"))
            _mark_page(page)

            expect(page.locator("#lease-state")).to_have_text("running", timeout=LIVE_TIMEOUT_MS)
            _assert_not_reloaded(page)
            expect(page.locator(".lease-url")).to_have_count(1)
            expect(page.locator(".lease-url")).to_contain_text("-i.tunnels.test/")
            expect(page.locator("#lease-logs")).to_contain_text("shown live below")
            # The mock agent's container output, streamed live into the page.
            expect(page.locator("#live-log")).to_contain_text("mock container: started")
            expect(page.locator("#live-log")).to_contain_text("mock container: tick 1")
            _assert_not_reloaded(page)
            screenshot(page, "lease-running")

            lease = Lease.objects.get(renter__username=renter)
            assert lease.stop_at is not None
            # Long enough to cost whole cents at this price.
            wait_for(
                lambda: Lease.objects.filter(pk=lease.pk, charged_micros__gt=0).exists(),
                timeout_s=30,
                what="the first charge",
            )
            # Stop asks first (issue 20 item 5).
            page.once("dialog", lambda dialog: dialog.accept())
            page.click("#stop-button")
            expect(page.locator(".messages")).to_contain_text("Stopping your rental")
            _mark_page(page)
            expect(page.locator("#lease-state")).to_have_text("ended", timeout=LIVE_TIMEOUT_MS)
            _assert_not_reloaded(page)
            screenshot(page, "lease-ended")

            lease.refresh_from_db()
            assert lease.end_reason == Lease.EndReason.RENTER_STOP
            assert lease.charged_micros > 0
            page.goto("/usage/")
            cost = page.locator("#usage-table .lease-cost").first
            from hub.billing.money import format_micros

            expect(cost).to_have_text(format_micros(lease.charged_micros, cents=True))
            expect(page.locator("#balance")).to_have_text(
                format_micros(100_000_000 - lease.charged_micros, cents=True)
            )
            screenshot(page, "usage")
            page.goto("/leases/")
            screenshot(page, "leases")
            # Everything above ran under the Content-Security-Policy (no inline scripts).
            assert blocked == []
            context.close()


def test_a_supplier_creates_a_token_starts_an_agent_sees_it_online_and_sets_a_price(
    browser: Any, tmp_path: Path, screenshot: Any
) -> None:
    expect = _expect()
    username = f"supplier-{uuid.uuid4().hex[:6]}"
    with hub_stack(tmp_path) as stack:
        context = browser.new_context(base_url=stack.url())
        page = context.new_page()
        page.set_default_timeout(20_000)
        _sign_up(page, stack.url(), username)

        page.goto("/supplier/tokens/")
        page.fill("#id_name", "rig-1")
        page.click("text=Create token")
        token = page.locator("#token-value").inner_text().strip()
        assert token.startswith("cgpu_")
        # Never on a command line: the installer shown asks for the token (tests/web/
        # test_install_command.py installs with the one-liner and its enrollment code).
        expect(page.locator("#prompt-install-command")).to_have_text(
            re.compile(r"/install\.sh \| sudo bash$")
        )
        assert f"bash -s {token}" not in page.content()
        screenshot(page, "tokens")

        page.goto("/supplier/hosts/")
        expect(page.locator("#no-hosts")).to_be_visible()
        _mark_page(page)
        state = tmp_path / "agent"
        assert configure(state, stack.url(), token, "--runtime", "mock").returncode == 0
        with running_agent(state, tmp_path / "agent.log"):
            status = page.locator(".host-status").first
            expect(status).to_have_text("online", timeout=LIVE_TIMEOUT_MS)
            _assert_not_reloaded(page)
            expect(page.locator("section.host")).to_contain_text("RTX 4090")
            screenshot(page, "hosts")

            # A new GPU is not for rent until its supplier prices it (issue 14 item 5).
            expect(page.locator("section.host")).to_contain_text("needs a price")
            price = page.locator("form.gpu-terms input[type=number]").first
            price.fill("0.75")
            page.locator("form.gpu-terms input[type=checkbox]").first.check()
            page.locator("form.gpu-terms button").first.click()
            expect(page.locator(".messages")).to_contain_text("$0.75/h")
            gpu = Gpu.objects.get(host__owner__username=username)
            assert gpu.price_per_hour_micros == 750_000
            assert gpu.listed

            page.goto("/supplier/earnings/")
            expect(page.locator("#total-earned")).to_have_text("$0.00")
            screenshot(page, "earnings")
        context.close()
