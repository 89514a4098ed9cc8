"""`cloudgpu login` against a real hub web process: the token comes from stdin, is checked,
and lands in $XDG_CONFIG_HOME/cloudgpu/config.json at 0600 (folder 0700), never in output."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hub.accounts.api_tokens import create_api_token
from tests.hub import factories as f
from tests.support.hub_stack import web_only

pytestmark = pytest.mark.django_db(transaction=True)

CLOUDGPU = str(Path(sys.executable).with_name("cloudgpu"))


def cloudgpu(config_home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDGPU_")}
    env["XDG_CONFIG_HOME"] = str(config_home)
    return subprocess.run(
        [CLOUDGPU, *args], input=stdin, capture_output=True, text=True, env=env, timeout=60
    )


def test_login_stores_the_token_0600_and_never_shows_it(tmp_path: Path) -> None:
    user = f.make_user("renter")
    _, token = create_api_token(user, "cli", ["read", "leases"])
    with web_only(tmp_path / "web.log") as port:
        hub = f"http://127.0.0.1:{port}"
        login = cloudgpu(tmp_path, "login", "--hub", hub, stdin=token + "\n")
        assert login.returncode == 0, login.stderr
        balance = cloudgpu(tmp_path, "balance", "--json")
        logout = cloudgpu(tmp_path, "logout")
        after = cloudgpu(tmp_path, "balance")
    path = tmp_path / "cloudgpu" / "config.json"
    for result in (login, balance, logout, after):
        assert token not in result.stdout + result.stderr
    assert user.username in login.stderr
    assert json.loads(balance.stdout)["username"] == user.username
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    stored = json.loads(path.read_text())
    assert stored == {"hub": hub}  # logout removed the token and kept the hub
    assert [p.name for p in path.parent.iterdir()] == ["config.json"]  # no temp file left
    assert after.returncode == 3
    assert after.stderr.strip() == (
        "cloudgpu: not logged in: run `cloudgpu login` (or set CLOUDGPU_TOKEN)"
    )


def test_a_refused_token_is_not_stored(tmp_path: Path) -> None:
    with web_only(tmp_path / "web.log") as port:
        wrong = "cgpr_not_a_real_token_at_all_0123456789"
        login = cloudgpu(tmp_path, "login", "--hub", f"http://127.0.0.1:{port}", stdin=wrong)
    assert login.returncode == 3
    assert login.stderr.startswith("cloudgpu: token refused by the hub")
    assert login.stderr.count("\n") == 1
    assert wrong not in login.stdout + login.stderr
    assert not (tmp_path / "cloudgpu" / "config.json").exists()
