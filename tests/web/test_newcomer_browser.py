"""Issue 20 as a newcomer sees it, in a real browser against a live hub with a mock-runtime
agent: one true GPU state that follows a rental live, a last-seen time that counts on, named
hosts, a template that fills the rent form, Stop that asks first, an ended rental's page that
tells the truth, and the top-up path from the renter's page to the admin's."""

from __future__ import annotations

import re
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from hub.accounts.models import User
from hub.billing.models import LedgerEntry, TopUpRequest
from hub.catalog.models import Template
from hub.leases.models import Lease
from hub.suppliers import services as supplier_services
from hub.suppliers.models import Host
from tests.support.agents import configure, running_agent
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for
from tests.web.test_browser import LIVE_TIMEOUT_MS, PASSWORD, _csp_violations, _sign_up

pytestmark = pytest.mark.django_db(transaction=True)


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def _log_in(page: Any, username: str) -> None:
    page.goto("/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("button[type=submit]")


def _gpu_status(page: Any) -> Any:
    return page.locator("section.host tr[data-gpu] .gpu-status .badge").first


def test_a_gpu_s_state_follows_a_rental_hosts_are_named_and_an_ended_rental_tells_the_truth(
    browser: Any, tmp_path: Path, screenshot: Any
) -> None:
    expect = _expect()
    supplier = User.objects.create_user(f"supplier-{uuid.uuid4().hex[:6]}", password=PASSWORD)
    renter = User.objects.create_user(f"renter-{uuid.uuid4().hex[:6]}", password=PASSWORD)
    Template.objects.create(
        slug="web-demo",
        name="Web demo",
        image="busybox:1.36",
        ports=[8080],
        env={"GREETING": "hello"},
        command=["httpd", "-f", "-p", "8080"],
        warmup=["true"],
    )
    with hub_stack(tmp_path) as stack:
        _, token = supplier_services.create_agent_token(
            supplier, "rig", default_price_per_hour_micros=0
        )
        state = tmp_path / "agent"
        assert configure(state, stack.url(), token, "--runtime", "mock").returncode == 0
        with ExitStack() as agent:
            agent.enter_context(running_agent(state, tmp_path / "agent.log"))
            host = wait_for(
                lambda: Host.objects.filter(owner=supplier, status="online").first(),
                timeout_s=60,
                what="host online",
            )
            short_id = host.agent_id.hex[:6]

            # The supplier names the host; the page shows name and short id, the GPU listed.
            sup = browser.new_context(base_url=stack.url()).new_page()
            sup.set_default_timeout(20_000)
            blocked = _csp_violations(sup)
            _log_in(sup, supplier.username)
            sup.goto("/supplier/hosts/")
            sup.fill("form.host-details input[name=name]", "rack-3")
            sup.fill("form.host-details input[name=location]", "DE")
            sup.click("form.host-details button")
            expect(sup.locator(".messages")).to_contain_text(f"rack-3 · {short_id}")
            expect(sup.locator("section.host .host-name")).to_have_text("rack-3")
            expect(sup.locator("section.host .host-short-id")).to_contain_text(short_id)
            expect(_gpu_status(sup)).to_have_text("listed, idle", timeout=LIVE_TIMEOUT_MS)
            sup.evaluate("window.__noReload = 'still here'")
            screenshot(sup, "newcomer-hosts-listed")

            # The renter finds it by name and location, and the template fills the form.
            page = browser.new_context(base_url=stack.url()).new_page()
            page.set_default_timeout(20_000)
            blocked_renter = _csp_violations(page)
            _log_in(page, renter.username)
            page.goto("/offers/?location=de")
            row = page.locator("#offers-table tbody tr[data-gpu]")
            expect(row).to_have_count(1)
            expect(row.locator(".host-label")).to_have_text(f"rack-3 · {short_id}")
            expect(row).to_contain_text("DE")
            row.get_by_role("link", name="Rent").click()
            page.wait_for_load_state()
            page.select_option("#id_template", label="Web demo")
            expect(page.locator("#id_image")).to_have_value("busybox:1.36")
            expect(page.locator("#id_ports")).to_have_value("8080")
            expect(page.locator("#id_env")).to_have_value("GREETING=hello")
            expect(page.locator("#id_command")).to_have_value("httpd -f -p 8080")
            expect(page.locator("#id_warmup")).to_have_value("true")
            screenshot(page, "newcomer-rent-template-filled")
            page.select_option("#id_template", label="Custom image")
            expect(page.locator("#id_image")).to_have_value("")
            page.select_option("#id_template", label="Web demo")
            page.click("#rent-form button[type=submit]")
            expect(page).to_have_url(re.compile(r"/leases/[0-9a-f-]{36}/$"))
            expect(page.locator("#lease-state")).to_have_text("running", timeout=LIVE_TIMEOUT_MS)
            expect(page.locator("#live-log")).to_contain_text("mock container: tick 1")
            expect(page.locator("#lease-panel")).to_contain_text(f"rack-3 · {short_id}")

            # The supplier's page says rented, live, without a reload.
            expect(_gpu_status(sup)).to_have_text("rented", timeout=LIVE_TIMEOUT_MS)
            assert sup.evaluate("window.__noReload") == "still here"
            screenshot(sup, "newcomer-hosts-rented")

            # Stop asks first: declining keeps it running.
            page.once("dialog", lambda dialog: dialog.dismiss())
            page.click("#stop-button")
            expect(page.locator("#lease-state")).to_have_text("running")
            lease = Lease.objects.get(renter=renter)
            assert Lease.objects.get(pk=lease.pk).state == Lease.State.RUNNING
            page.once("dialog", lambda dialog: dialog.accept())
            page.click("#stop-button")
            expect(page.locator(".messages")).to_contain_text("Stopping your rental")
            expect(page.locator("#lease-state")).to_have_text("ended", timeout=LIVE_TIMEOUT_MS)
            # The ended page: the output it printed, a cost (not "so far"), no "no output".
            expect(page.locator("#lease-logs")).to_contain_text("mock container: started")
            expect(page.locator("#lease-logs")).not_to_contain_text("left no output")
            expect(page.locator("#lease-panel")).not_to_contain_text("Cost so far")
            expect(page.locator("#lease-cost")).to_have_text("$0.00")
            expect(page.locator("#live-logs")).to_be_hidden()
            screenshot(page, "newcomer-lease-ended")
            page.reload()
            expect(page.locator("#lease-logs")).to_contain_text("mock container: started")
            expect(page.locator("#lease-panel")).not_to_contain_text("Cost so far")

            expect(_gpu_status(sup)).to_have_text("listed, idle", timeout=LIVE_TIMEOUT_MS)

        # The agent gone: the GPU says offline, and "last seen" counts on by itself.
        expect(_gpu_status(sup)).to_have_text("offline", timeout=LIVE_TIMEOUT_MS)
        seen = sup.locator("section.host .host-last-seen time")
        expect(seen).to_have_text(re.compile(r"^\d+ s ago$"), timeout=LIVE_TIMEOUT_MS)
        first = seen.inner_text()
        expect(seen).not_to_have_text(first, timeout=15_000)
        assert sup.evaluate("window.__noReload") == "still here"
        screenshot(sup, "newcomer-hosts-offline")
        assert blocked == []
        assert blocked_renter == []


def test_a_renter_asks_for_a_top_up_and_an_admin_adds_it_from_their_page(
    browser: Any, tmp_path: Path, screenshot: Any
) -> None:
    expect = _expect()
    admin = User.objects.create_superuser(f"admin-{uuid.uuid4().hex[:6]}", password=PASSWORD)
    renter = f"renter-{uuid.uuid4().hex[:6]}"
    with hub_stack(tmp_path) as stack:
        page = browser.new_context(base_url=stack.url()).new_page()
        page.set_default_timeout(20_000)
        blocked = _csp_violations(page)
        _sign_up(page, stack.url(), renter)
        page.goto("/usage/")
        expect(page.locator("#add-funds")).to_contain_text("add funds")
        page.fill("#id_topup-amount", "25")
        page.fill("#id_topup-note", "for a week of training")
        page.click("#add-funds button[type=submit]")
        expect(page.locator(".messages")).to_contain_text("$25.00")
        expect(page.locator("#topup-requests")).to_contain_text("waiting")
        screenshot(page, "newcomer-topup-requested")

        staff = browser.new_context(base_url=stack.url()).new_page()
        staff.set_default_timeout(20_000)
        staff.goto("/admin/login/")
        staff.fill("#id_username", admin.username)
        staff.fill("#id_password", PASSWORD)
        staff.click("input[type=submit]")
        expect(staff.locator("#fleet-link")).to_contain_text("Fleet")
        expect(staff).to_have_title(re.compile("CloudGPU admin"))
        # Item 9: the hosts list fits its columns at a laptop's width, long names included.
        for hostname in ("vm", "vm", "a-very-long-hostname-of-a-cloud-vm-in-region-x.internal"):
            Host.objects.create(owner=admin, agent_id=uuid.uuid4(), hostname=hostname)
        staff.set_viewport_size({"width": 1280, "height": 800})
        staff.goto("/admin/suppliers/host/")
        expect(staff.locator("#result_list tbody tr")).to_have_count(3)
        assert staff.evaluate(
            "(() => { const t = document.querySelector('#result_list');"
            " return t.scrollWidth <= t.parentElement.clientWidth; })()"
        )
        screenshot(staff, "newcomer-admin-hosts")
        user = User.objects.get(username=renter)
        staff.goto(f"/admin/accounts/user/{user.pk}/change/")
        staff.click("#adjust-balance-link")
        expect(staff.locator("#topup-requests")).to_contain_text("for a week of training")
        expect(staff.locator("#id_amount")).to_have_value("25.00")
        staff.fill("#id_reason", "paid by bank transfer 4711")
        screenshot(staff, "newcomer-admin-top-up")
        staff.click("input[name=apply]")
        expect(staff.locator(".messagelist")).to_contain_text("$25.00")

        entry = LedgerEntry.objects.get(account=user)
        assert entry.reason == "paid by bank transfer 4711"
        assert entry.created_by == admin
        assert TopUpRequest.objects.get(account=user).ledger_entry == entry

        page.goto("/usage/")
        expect(page.locator("#balance")).to_have_text("$25.00")
        expect(page.locator("#topup-requests")).to_contain_text("added")
        screenshot(page, "newcomer-topup-added")
        assert blocked == []
