"""`cloudgpu ssh`: the Host entries for a lease (checked by the real OpenSSH client's `ssh -G`,
which resolves a config without connecting), written idempotently at 0600, and the system ssh
exec'd with them; against a real HTTP server on 127.0.0.1 (tests/cli/canned_hub.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli.canned_hub import CannedHub, canned_hub, cloudgpu, lease, one_line

pytestmark = pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")

GATEWAY_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"
GATEWAY_ALIAS = "cloudgpu-gateway-gw.example.com-2222"


def ssh_details(listen_port: int = 23817, alias: str = "cloudgpu-1a2b3c4d") -> dict[str, Any]:
    return {
        "gateway_host": "gw.example.com",
        "gateway_port": 2222,
        "user": "cloudgpu-ssh",
        "host_alias": alias,
        "known_hosts": [f"[gw.example.com]:2222 {GATEWAY_KEY}"],
        "forwards": [
            {"port": 22, "listen_port": listen_port, "local_port": 10022, "command": "ssh -N"},
            {"port": 8080, "listen_port": 23818, "local_port": 8080, "command": "ssh -N"},
        ],
        "config": "Host ...",
    }


LEASE = lease(ssh=ssh_details())
DETAIL = f"/api/v1/leases/{LEASE['id']}/"


@pytest.fixture
def hub() -> Iterator[CannedHub]:
    with canned_hub() as running:
        running.answer("GET", DETAIL, 200, LEASE)
        yield running


def resolved(config: Path, host: str) -> dict[str, str]:
    """What the real ssh makes of ``host`` with ``config`` (`ssh -G`: no connection)."""
    result = subprocess.run(
        ["ssh", "-G", "-F", str(config), host], capture_output=True, text=True, check=True
    )
    return dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)


def test_print_config_gives_entries_ssh_reads_as_meant(hub: CannedHub, tmp_path: Path) -> None:
    result = cloudgpu(tmp_path, hub.url, "ssh", "--print-config", LEASE["id"])
    assert result.returncode == 0, result.stderr
    config = tmp_path / "printed"
    config.write_text(result.stdout)
    rental = resolved(config, "cloudgpu-1a2b3c4d")
    assert rental["hostname"] == "127.0.0.1"
    assert rental["port"] == "23817"
    assert rental["user"] == "root"
    assert rental["proxyjump"] == GATEWAY_ALIAS
    assert rental["hostkeyalias"] == "cloudgpu-1a2b3c4d"
    gateway = resolved(config, GATEWAY_ALIAS)
    assert (gateway["hostname"], gateway["port"], gateway["user"]) == (
        "gw.example.com",
        "2222",
        "cloudgpu-ssh",
    )
    assert gateway["stricthostkeychecking"] == "true"
    known = tmp_path / ".config" / "cloudgpu" / "known_hosts"
    assert gateway["userknownhostsfile"] == str(known)
    # The gateway's key as the hub announced it, where the entry looks for it.
    assert known.read_text() == f"[gw.example.com]:2222 {GATEWAY_KEY}\n"
    assert stat.S_IMODE(known.stat().st_mode) == 0o600


def test_an_identity_file_is_used_alone(hub: CannedHub, tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("not read by the CLI\n")
    result = cloudgpu(tmp_path, hub.url, "ssh", "--print-config", "-i", str(key), LEASE["id"])
    config = tmp_path / "printed"
    config.write_text(result.stdout)
    for host in ("cloudgpu-1a2b3c4d", GATEWAY_ALIAS):
        seen = resolved(config, host)
        assert seen["identitiesonly"] == "yes"
        assert str(key) in seen["identityfile"]


def test_write_config_is_idempotent_private_and_included_first(
    hub: CannedHub, tmp_path: Path
) -> None:
    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o700)
    # A catch-all of the user's own: the lease's entries must win over it.
    (ssh / "config").write_text("Host *\n    User somebody\n    Port 2200\n")
    for _ in range(2):
        result = cloudgpu(tmp_path, hub.url, "ssh", "--write-config", LEASE["id"])
        assert result.returncode == 0, result.stderr
    ours = ssh / "config.d" / "cloudgpu"
    text = ours.read_text()
    assert text.count("Host cloudgpu-1a2b3c4d\n") == 1
    assert stat.S_IMODE(ours.stat().st_mode) == 0o600
    main = (ssh / "config").read_text()
    assert main.startswith("# >>> cloudgpu include >>>\n")
    assert main.count("Include ") == 1
    assert main.endswith("Host *\n    User somebody\n    Port 2200\n")
    assert stat.S_IMODE((ssh / "config").stat().st_mode) == 0o600
    rental = resolved(ssh / "config", "cloudgpu-1a2b3c4d")
    assert (rental["user"], rental["port"]) == ("root", "23817")

    # The same lease on a new gateway port replaces its block; another lease adds its own.
    hub.answer("GET", DETAIL, 200, lease(ssh=ssh_details(listen_port=24000)))
    assert cloudgpu(tmp_path, hub.url, "ssh", "--write-config", LEASE["id"]).returncode == 0
    other = lease(
        id="5e6f7a8b-0000-4000-8000-000000000009", ssh=ssh_details(alias="cloudgpu-5e6f7a8b")
    )
    hub.answer("GET", f"/api/v1/leases/{other['id']}/", 200, other)
    assert cloudgpu(tmp_path, hub.url, "ssh", "--write-config", other["id"]).returncode == 0
    text = ours.read_text()
    assert text.count("Host cloudgpu-1a2b3c4d\n") == 1
    assert text.count("Host cloudgpu-5e6f7a8b\n") == 1
    assert resolved(ssh / "config", "cloudgpu-1a2b3c4d")["port"] == "24000"
    assert (ssh / "config").read_text().count("Include ") == 1


def test_plain_ssh_execs_the_system_ssh_with_the_entries(hub: CannedHub, tmp_path: Path) -> None:
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text("Host *\n    ServerAliveCountMax 7\n")
    # A stand-in for ssh on PATH: records how it was started (argv, no shell in between).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "argv"
    fake = bin_dir / "ssh"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" > {record}\nexit 42\n')
    fake.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    result = cloudgpu(tmp_path, hub.url, "ssh", LEASE["id"], "--", "nvidia-smi", "-L", PATH=path)
    assert result.returncode == 42  # ssh's own exit status: cloudgpu became ssh
    argv = record.read_text().splitlines()
    own = tmp_path / ".config" / "cloudgpu" / "ssh_config"
    assert argv == [str(fake), "-F", str(own), "cloudgpu-1a2b3c4d", "nvidia-smi", "-L"]
    assert stat.S_IMODE(own.stat().st_mode) == 0o600
    rental = resolved(own, "cloudgpu-1a2b3c4d")
    assert rental["proxyjump"] == GATEWAY_ALIAS
    assert rental["serveralivecountmax"] == "7"  # the user's own config still applies


@pytest.mark.parametrize(
    ("answer", "start"),
    [
        (lease("starting"), "lease 1a2b3c4d-0000-4000-8000-000000000001 is starting"),
        (lease(), "lease 1a2b3c4d-0000-4000-8000-000000000001 has no SSH access"),
        (
            lease(ssh={**ssh_details(), "forwards": ssh_details()["forwards"][1:]}),
            "lease 1a2b3c4d-0000-4000-8000-000000000001 does not declare port 22",
        ),
    ],
)
def test_no_ssh_says_why_in_one_line(
    hub: CannedHub, tmp_path: Path, answer: dict[str, Any], start: str
) -> None:
    hub.answer("GET", DETAIL, 200, answer)
    one_line(cloudgpu(tmp_path, hub.url, "ssh", LEASE["id"]), 1, start)


def test_details_that_would_break_the_config_are_refused(hub: CannedHub, tmp_path: Path) -> None:
    bad = {**ssh_details(), "gateway_host": "gw\n    ProxyCommand evil"}
    hub.answer("GET", DETAIL, 200, lease(ssh=bad))
    result = cloudgpu(tmp_path, hub.url, "ssh", "--write-config", LEASE["id"])
    one_line(result, 5, "hub error: the lease's ssh details are malformed")
    assert not (tmp_path / ".ssh").exists()
