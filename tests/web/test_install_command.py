"""A supplier adds a host with the install command from the tokens page, in a real browser
against a live hub: the one-liner carries no token, and run as shown it installs an agent
that connects with a token of its own."""

from __future__ import annotations

import configparser
import re
import stat
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from hub.accounts.models import User
from hub.installer.models import EnrollmentCode
from hub.suppliers.models import Host
from tests.support.agents import agent_env
from tests.support.hub_stack import hub_stack
from tests.support.processes import running

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "correct-Horse-battery-9"
LIVE_TIMEOUT_MS = 45_000
INSTALL_TIMEOUT_S = 600


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def _sign_up(page: Any, username: str) -> None:
    page.goto("/signup/")
    page.fill("#id_username", username)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.click("button[type=submit]")
    _expect()(page.locator(".messages")).to_contain_text(f"Welcome, {username}")


def _run_as_shown(command: str, prefix: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """The one-liner exactly as the page shows it, with the options a test host needs. The
    tests run as root or without sudo, so the line runs without it."""
    line = command.replace(" | sudo bash -s ", " | bash -s ", 1)
    assert line != command
    # Without systemd the new version first runs a trial of --health-window seconds before the
    # switch, 30 by default: one is enough here (the agent is started and seen online below).
    line += f" --prefix {prefix} --no-systemd --runtime mock --health-window 1"
    temp = tmp / "tmp"
    temp.mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", "-c", line],
        env=agent_env(TMPDIR=str(temp)),
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        check=False,
    )


def test_the_install_command_carries_no_token_and_installs_a_working_agent(
    browser: Any, tmp_path: Path, screenshot: Any
) -> None:
    expect = _expect()
    username = f"supplier-{uuid.uuid4().hex[:6]}"
    prefix = tmp_path / "prefix"
    state = prefix / "state"
    dist = str(tmp_path / "agent-dist")
    with hub_stack(tmp_path, public=True, AGENT_DIST_DIR=dist) as stack:
        context = browser.new_context(base_url=stack.url())
        page = context.new_page()
        page.set_default_timeout(20_000)
        _sign_up(page, username)

        page.goto("/supplier/tokens/")
        page.fill("#id_enroll-name", "rig-browser")
        page.click("text=Create install command")
        command = page.locator("#install-command").inner_text().strip()
        assert "cgpu_" not in command
        assert "cgpu_" not in page.content()
        shown = re.fullmatch(
            rf"curl -fsSL {re.escape(stack.url())}/install\.sh \| sudo bash -s "
            r"(cgpe_[0-9A-Za-z]{36})",
            command,
        )
        assert shown is not None, command
        code = shown.group(1)
        screenshot(page, "install-command")

        installed = _run_as_shown(command, prefix, tmp_path)
        assert installed.returncode == 0, installed.stderr
        assert "cloudgpu-install: success:" in installed.stderr
        config = state / "cloudgpu-agent.conf"
        assert stat.S_IMODE(config.stat().st_mode) == 0o600
        parser = configparser.ConfigParser(interpolation=None)
        parser.read(config)
        token = parser["agent"]["token"]
        assert token.startswith("cgpu_")
        assert token not in installed.stdout + installed.stderr
        supplier = User.objects.get(username=username)
        used = EnrollmentCode.objects.select_related("token").get(owner=supplier)
        assert used.used_at is not None
        assert used.token is not None
        assert used.token.name == "rig-browser"

        # The token works: the installed agent connects with it and the host comes online.
        page.goto("/supplier/hosts/")
        agent = [str(prefix / "venv" / "bin" / "cloudgpu-agent"), "run", "--state", str(state)]
        with running(agent, env=agent_env(), log=tmp_path / "agent.log"):
            expect(page.locator(".host-status").first).to_have_text(
                "online", timeout=LIVE_TIMEOUT_MS
            )
        host = Host.objects.get(owner=supplier)
        assert host.token_id == used.token.pk

        page.goto("/supplier/tokens/")
        expect(page.locator("#waiting-install-commands")).to_have_count(0)
        expect(page.locator("body")).to_contain_text("rig-browser")
        screenshot(page, "tokens-after-install")

        # The line left in shell history is worthless now.
        again = _run_as_shown(command, tmp_path / "second", tmp_path)
        assert again.returncode == 4
        assert "already used" in again.stderr
        assert code not in again.stdout + again.stderr
        assert not (tmp_path / "second").exists()
        context.close()
