"""The renters' `cloudgpu` command end to end: the installed console script against a real hub
(web, worker, beat) and a real agent with the Docker runtime running busybox containers.

One session on one hub, so the suite's wall time stays flat: a refused token (exit 3), login
with the token on stdin, offers with a filter, a price raised above --max-price and an account
out of funds (one line, exit 1 each, nothing rented), a volume, a rental with a warm-up and
the volume mounted, waited on until it runs, ls, show, logs (the warm-up's output), exec (its
exit code ours), the terminal, stop, the cost in the balance, keys and a top-up request. An
unreachable hub needs no hub at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from hub.accounts.api_tokens import create_api_token
from hub.accounts.models import User
from hub.billing.models import TopUpRequest
from hub.billing.services import adjust
from hub.leases.models import Lease
from hub.lib.ports import free_port
from hub.suppliers.models import Gpu
from tests.hub import factories as f
from tests.support.docker_agent import docker_agent_online
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for

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


def one_line(result: subprocess.CompletedProcess[str], code: int, start: str) -> None:
    assert result.returncode == code, (result.args, result.stdout, result.stderr)
    assert result.stderr.startswith(f"cloudgpu: {start}"), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.django_db(transaction=True)
@pytest.mark.docker
def test_a_renters_session(tmp_path: Path, busybox_image: str, docker_client: Any) -> None:
    supplier = User.objects.create_user(f"supplier-{uuid.uuid4().hex[:6]}")
    renter = f.make_user("renter")
    adjust(renter, 100_000_000, "test top-up", by=f.make_user("admin", is_staff=True))
    _, token = create_api_token(renter, "cli", ["read", "leases"])
    _, broke_token = create_api_token(f.make_user("broke"), "cli", ["read", "leases"])
    home, broke_home = tmp_path / "config", tmp_path / "broke"
    seen: list[str] = []

    def run(*args: str, stdin: str = "", where: Path = home) -> subprocess.CompletedProcess[str]:
        result = cloudgpu(where, *args, stdin=stdin)
        seen.append(result.stdout + result.stderr)
        return result

    (tmp_path / "hub").mkdir()
    with (
        hub_stack(tmp_path / "hub") as stack,
        docker_agent_online(stack, tmp_path, supplier) as host,
    ):
        host_id = host.pk
        try:
            # The agent lists its GPU at $0; priced here, so a rental costs and funds matter.
            Gpu.objects.filter(host_id=host_id).update(price_per_hour_micros=PRICE_MICROS)

            wrong = "cgpr_wrong_token_0123456789abcdefghijkl"
            one_line(run("login", "--hub", stack.url(), stdin=wrong), 3, "token refused by the hub")
            ok(run("login", "--hub", stack.url(), stdin=token + "\n"))

            def offered() -> list[dict[str, Any]] | None:
                found = json.loads(
                    ok(run("offers", "gpu=H100", "vram>=20", "price<=40", "--json")).stdout
                )
                return found or None

            (offer,) = wait_for(offered, timeout_s=60, interval_s=0.5, what="the GPU's offer")
            assert offer["host_id"] == host_id
            gpu = str(offer["gpu_id"])
            assert "H100" in ok(run("offers", "gpu=H100")).stdout
            assert json.loads(ok(run("offers", "price<=1", "--json")).stdout) == []

            # A price raised above what the renter saw (the API's 409), and an account out of funds:
            # one line each, exit 1, nothing rented.
            raised = run("rent", gpu, "--image", busybox_image, "--max-price", "0.01")
            one_line(raised, 1, "the price changed")
            ok(run("login", "--hub", stack.url(), stdin=broke_token, where=broke_home))
            broke = run("rent", gpu, "--image", busybox_image, "--no-wait", where=broke_home)
            one_line(broke, 1, "out of funds")
            assert json.loads(ok(run("ls", "--json")).stdout) == []

            volume_id = ok(
                run("volumes", "create", "data", "--host", str(host_id), "--size", "1")
            ).stdout
            rented = run(
                "rent", gpu, "--image", busybox_image, "--command", "sleep 3600",
                "--warmup", "sh -c 'echo warm-$((6*7))'", "--volume", "data:/data", "--json",
            )  # fmt: skip
            lease = json.loads(ok(rented).stdout)
            assert lease["state"] == "running", lease
            lease_id = lease["id"]
            assert lease["volumes"] == [{"volume_id": volume_id.strip(), "path": "/data"}]

            assert lease_id in ok(run("ls")).stdout
            shown = ok(run("show", lease_id)).stdout
            assert f"lease  {lease_id}" in shown
            assert "state  running" in shown
            assert "warmup sh -c echo warm-$((6*7))" in shown
            # The warm-up's output is kept by the hub whether or not anyone followed the logs.
            assert "warm-42" in ok(run("logs", lease_id)).stdout
            assert json.loads(ok(run("logs", lease_id, "--json")).stdout)["lease_id"] == lease_id

            script = "echo out-$((6*7)) > /data/f && cat /data/f && exit 3"
            executed = run("exec", lease_id, "--", "sh", "-c", script)
            assert (executed.returncode, executed.stdout) == (3, "out-42\n"), executed.stderr

            typed = run("terminal", lease_id, stdin="cat /data/f; echo term-$((6*7))\nexit 4\n")
            assert typed.returncode == 4, (typed.stdout, typed.stderr)
            assert "out-42" in typed.stdout
            assert "term-42" in typed.stdout
            assert "data" in ok(run("volumes")).stdout

            ok(run("stop", lease_id))

            def ended() -> dict[str, Any] | None:
                body = json.loads(ok(run("show", lease_id, "--json")).stdout)
                return body if body["state"] in ("ended", "failed") else None

            assert (
                wait_for(ended, timeout_s=60, interval_s=0.5, what="the lease ended")["state"]
                == "ended"
            )
            # -f on an ended lease prints what there is and returns at once.
            ok(run("logs", lease_id, "-f"))
            assert json.loads(ok(run("ls", "--json")).stdout) == []
            assert lease_id in ok(run("ls", "--all")).stdout
            assert "cost " in ok(run("show", lease_id)).stdout

            account = json.loads(ok(run("balance", "--json")).stdout)
            assert account["balance_micros"] < 100_000_000
            assert any(row["lease_id"] == lease_id for row in account["ledger"])
            assert "balance" in ok(run("balance")).stdout
            assert "data: " in ok(run("volumes", "delete", "data")).stderr

            public = Ed25519PrivateKey.generate().public_key()
            line = (
                public.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode() + " me@laptop"
            )
            (tmp_path / "id.pub").write_text(line + "\n")
            ok(run("keys", "add", str(tmp_path / "id.pub")))
            assert "me@laptop" in ok(run("keys")).stdout

            assert "asked for $25.00" in ok(run("topup", "25", "--note", "by wire")).stderr
            assert TopUpRequest.objects.get(account__username=account["username"]).note == "by wire"
        finally:
            # Only this session's containers: the Docker engine is shared with other tests.
            for lease_id in Lease.objects.filter(host=host).values_list("pk", flat=True):
                for container in docker_client.containers.list(
                    all=True, filters={"label": f"cloudgpu.lease={lease_id}"}
                ):
                    container.remove(force=True)
    for output in seen:
        assert token not in output
        assert broke_token not in output


def test_an_unreachable_hub_exits_4_with_one_line(tmp_path: Path) -> None:
    token = "cgpr_whatever_0123456789abcdefghijklmnop"
    hub = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLOUDGPU_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path), CLOUDGPU_HUB=hub, CLOUDGPU_TOKEN=token)
    result = subprocess.run(
        [CLOUDGPU, "offers"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    one_line(result, 4, f"hub unreachable: {hub}")
    assert token not in result.stdout + result.stderr
