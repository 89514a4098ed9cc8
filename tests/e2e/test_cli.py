"""The renters' `cloudgpu` command end to end: the installed console script against a real hub
(web, worker, beat) and a real agent in mock runtime. Login with the token on stdin, offers
with a filter, a rental waited on until it runs, ls, show, logs, stop, and the charge in the
balance; a refused token and an unreachable hub are one line each with their exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from hub.accounts.api_tokens import create_api_token
from hub.billing.services import adjust
from hub.lib.ports import free_port
from hub.suppliers.models import Host
from tests.hub import factories as f
from tests.support.agents import configure, running_agent
from tests.support.hub_stack import HubStack, hub_stack
from tests.support.polling import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

CLOUDGPU = str(Path(sys.executable).with_name("cloudgpu"))
# 36 units an hour: a hundredth a second, so even a rental of seconds shows in the balance.
PRICE_MICROS = 36_000_000


def cloudgpu(config_home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDGPU_")}
    env["XDG_CONFIG_HOME"] = str(config_home)
    return subprocess.run(
        [CLOUDGPU, *args], input=stdin, capture_output=True, text=True, env=env, timeout=700
    )


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    return result


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[HubStack]:
    logs = tmp_path / "hub"
    logs.mkdir()
    with hub_stack(logs) as hub:
        yield hub


@pytest.fixture
def supplier_host(stack: HubStack, tmp_path: Path) -> Iterator[Host]:
    _, token = f.make_token(default_price_per_hour_micros=PRICE_MICROS)
    state = tmp_path / "agent"
    configured = configure(state, stack.url(), token, "--runtime", "mock")
    assert configured.returncode == 0, configured.stderr
    with running_agent(state, tmp_path / "agent.log"):
        yield wait_for(
            lambda: Host.objects.filter(status="online").first(), timeout_s=60, what="the agent"
        )


def test_a_renters_session(stack: HubStack, supplier_host: Host, tmp_path: Path) -> None:
    renter = f.make_user("renter")
    adjust(renter, 100_000_000, "test top-up", by=f.make_user("admin", is_staff=True))
    _, token = create_api_token(renter, "cli", ["read", "leases"])
    home = tmp_path / "config"
    seen: list[str] = []

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        result = cloudgpu(home, *args, stdin=stdin)
        seen.append(result.stdout + result.stderr)
        return result

    ok(run("login", "--hub", stack.url(), stdin=token + "\n"))

    def offered() -> list[dict[str, object]] | None:
        found = json.loads(ok(run("offers", "gpu=4090", "vram>=20", "price<=40", "--json")).stdout)
        return found or None

    (offer,) = wait_for(offered, timeout_s=60, interval_s=0.5, what="the mock GPU's offer")
    assert offer["host_id"] == supplier_host.pk
    table = ok(run("offers", "gpu=4090")).stdout
    assert "RTX 4090" in table
    assert str(offer["gpu_id"]) in table
    assert json.loads(ok(run("offers", "price<=1", "--json")).stdout) == []

    # A price raised above what the renter saw (the API's 409): one line, exit 1, no rental.
    raised = run("rent", str(offer["gpu_id"]), "--image", "busybox", "--max-price", "0.01")
    assert raised.returncode == 1
    assert raised.stderr.startswith("cloudgpu: conflict: the price changed")
    assert raised.stderr.count("\n") == 1
    assert json.loads(ok(run("ls", "--json")).stdout) == []

    rented = ok(run("rent", str(offer["gpu_id"]), "--image", "busybox", "--json"))
    lease = json.loads(rented.stdout)
    assert lease["state"] == "running"
    lease_id = lease["id"]

    assert lease_id in ok(run("ls")).stdout
    assert json.loads(ok(run("ls", "--json")).stdout)[0]["id"] == lease_id
    shown = ok(run("show", lease_id)).stdout
    assert f"lease  {lease_id}" in shown
    assert "state  running" in shown
    logs = ok(run("logs", lease_id, "--json"))
    assert json.loads(logs.stdout)["lease_id"] == lease_id
    ok(run("logs", lease_id))

    ok(run("stop", lease_id))

    def ended() -> dict[str, object] | None:
        body = json.loads(ok(run("show", lease_id, "--json")).stdout)
        return body if body["state"] in ("ended", "failed") else None

    assert wait_for(ended, timeout_s=60, interval_s=0.5, what="the lease ended")["state"] == "ended"
    # -f on an ended lease prints what there is and returns at once.
    ok(run("logs", lease_id, "-f"))
    assert json.loads(ok(run("ls", "--json")).stdout) == []
    assert lease_id in ok(run("ls", "--all")).stdout

    account = json.loads(ok(run("balance", "--json")).stdout)
    assert account["balance_micros"] < 100_000_000
    assert any(row["lease_id"] == lease_id for row in account["ledger"])
    assert "balance" in ok(run("balance")).stdout

    public = Ed25519PrivateKey.generate().public_key()
    line = public.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode() + " me@laptop"
    (tmp_path / "id.pub").write_text(line + "\n")
    ok(run("keys", "add", str(tmp_path / "id.pub")))
    assert "me@laptop" in ok(run("keys")).stdout

    for output in seen:
        assert token not in output


def test_out_of_funds_is_one_line_and_exit_1(
    stack: HubStack, supplier_host: Host, tmp_path: Path
) -> None:
    _, token = create_api_token(f.make_user("broke"), "cli", ["read", "leases"])
    home = tmp_path / "config"
    ok(cloudgpu(home, "login", "--hub", stack.url(), stdin=token))
    offers = wait_for(
        lambda: json.loads(ok(cloudgpu(home, "offers", "--json")).stdout),
        timeout_s=60,
        interval_s=0.5,
        what="the offer",
    )
    result = cloudgpu(home, "rent", str(offers[0]["gpu_id"]), "--image", "busybox", "--no-wait")
    assert result.returncode == 1
    assert result.stderr.startswith("cloudgpu: out of funds")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_a_wrong_token_exits_3_with_one_line(stack: HubStack, tmp_path: Path) -> None:
    wrong = "cgpr_wrong_token_0123456789abcdefghijkl"
    result = cloudgpu(tmp_path, "login", "--hub", stack.url(), stdin=wrong)
    assert result.returncode == 3
    assert result.stderr.startswith("cloudgpu: token refused by the hub")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert wrong not in result.stdout + result.stderr


def test_an_unreachable_hub_exits_4_with_one_line(tmp_path: Path) -> None:
    token = "cgpr_whatever_0123456789abcdefghijklmnop"
    hub = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDGPU_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path), CLOUDGPU_HUB=hub, CLOUDGPU_TOKEN=token)
    result = subprocess.run(
        [CLOUDGPU, "offers"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert result.returncode == 4
    assert result.stderr.startswith(f"cloudgpu: hub unreachable: {hub}")
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr
    assert token not in result.stdout + result.stderr
