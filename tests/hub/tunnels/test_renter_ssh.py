"""Renters' SSH through the gateway on the real database: what the gateway's sshd is told for a
renter's key (only their own RUNNING leases' declared ports), what the lease page and API show,
the sshd configuration (checked by the real ``sshd -t``), and the template that takes the keys."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from hub.accounts.models import User
from hub.accounts.ssh_keys import add_ssh_key, delete_ssh_key
from hub.catalog.models import Template
from hub.catalog.services import lease_spec, with_account_keys
from hub.leases import services as lease_services
from hub.leases.models import Command, Lease
from hub.tunnels import renter_ssh
from hub.tunnels.gateway_config import GatewayOptions, render_sshd_config
from tests.hub import factories as f
from tests.hub.accounts.test_ssh_keys import keygen

pytestmark = pytest.mark.django_db

SECRET = "s" * 40
RENTER_USER = "cloudgpu-ssh"


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def gateway(settings: Any, tmp_path: Path) -> Path:
    host_key = keygen(tmp_path, comment="gw")
    keys_file = tmp_path / "gateway_host_keys"
    keys_file.write_text(host_key + "\n")
    settings.TUNNEL_DOMAIN = "tunnels.test"
    settings.TUNNEL_GATEWAY_SSH_HOST = "gw.internal"
    settings.TUNNEL_GATEWAY_SSH_PORT = 2222
    settings.TUNNEL_GATEWAY_PUBLIC_SSH_HOST = "gw.example.net"
    settings.TUNNEL_GATEWAY_PUBLIC_SSH_PORT = 2200
    settings.TUNNEL_GATEWAY_HOST_KEYS_FILE = str(keys_file)
    settings.TUNNEL_GATEWAY_SECRET = SECRET
    settings.TUNNEL_GATEWAY_RENTER_USER = RENTER_USER
    return keys_file


def _running(renter: User, ports: list[int]) -> Lease:
    host = f.register_host(gpus=(0,))
    lease = f.start_lease(host, renter=renter, ports=ports)
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    result = {"container_id": "c0ffee", "ports": {str(p): 41000 for p in ports}}
    assert f.ack(f.command_of(lease, Command.Kind.DOCKER_RUN), result=result)
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING
    return lease


def _listen_ports(lease: Lease) -> dict[int, int]:
    return dict(lease.tunnels.values_list("container_port", "listen_port"))


def _ask(user: str, line: str) -> str:
    """The gateway's question, as its key command asks it (the real endpoint and secret)."""
    key_type, blob = line.split()[:2]
    answer = Client().get(
        "/internal/tunnels/authorized-keys",
        {"user": user, "type": key_type, "key": blob},
        HTTP_X_CLOUDGPU_GATEWAY_SECRET=SECRET,
    )
    assert answer.status_code == 200
    return answer.content.decode()


def _permitted(answer: str) -> set[int]:
    return {int(p) for p in re.findall(r'permitopen="127\.0\.0\.1:(\d+)"', answer)}


def test_a_renter_key_may_open_exactly_its_own_running_leases_declared_ports(
    gateway: Path, tmp_path: Path
) -> None:
    alice, bob = f.make_user("renter"), f.make_user("renter")
    line = keygen(tmp_path)
    add_ssh_key(alice, line)
    first, second = _running(alice, [22, 8888]), _running(alice, [6006])
    neighbour = _running(bob, [22])
    answer = _ask(RENTER_USER, line)
    # One line: restrict (no pty, agent, X11, rc), local forwarding to the listed ports only,
    # no permitlisten (no -R), a command that refuses a shell.
    assert answer.count("\n") == 1
    options, key_type, blob, comment = answer.split()
    assert options.startswith("restrict,port-forwarding,permitopen=")
    assert options.endswith(',command="/usr/sbin/nologin"')
    assert "permitlisten" not in options
    assert f"{key_type} {blob}" == " ".join(line.split()[:2])
    assert comment == f"cloudgpu-renter-{alice.pk}"
    mine = {*_listen_ports(first).values(), *_listen_ports(second).values()}
    assert _permitted(answer) == mine  # the declared ports' gateway ports, nothing else
    assert not _permitted(answer) & set(_listen_ports(neighbour).values())


def test_nothing_for_an_unknown_key_the_agents_login_or_no_running_lease(
    gateway: Path, tmp_path: Path
) -> None:
    alice = f.make_user("renter")
    line = keygen(tmp_path)
    add_ssh_key(alice, line)
    assert _ask(RENTER_USER, line) == ""  # no lease at all
    _running(alice, [22])
    assert _ask(RENTER_USER, line) != ""
    assert _ask(RENTER_USER, keygen(tmp_path)) == ""  # a key on no account
    assert _ask("cloudgpu-tunnel", line) == ""  # a renter's key is no agent's key
    assert _ask("root", line) == ""
    key_type, blob = line.split()[:2]
    other_type = "ssh-rsa" if key_type != "ssh-rsa" else "ssh-ed25519"
    assert _ask(RENTER_USER, f"{other_type} {blob}") == ""  # same blob, another type


def test_an_ended_or_stopping_lease_and_a_deleted_key_open_nothing(
    gateway: Path, tmp_path: Path
) -> None:
    alice = f.make_user("renter")
    line = keygen(tmp_path)
    key = add_ssh_key(alice, line)
    stays, ends = _running(alice, [22]), _running(alice, [5432])
    lease_services.release_lease(ends.pk)  # stopping: closed to SSH before the agent answers
    assert _permitted(_ask(RENTER_USER, line)) == set(_listen_ports(stays).values())
    assert f.ack(f.command_of(ends, Command.Kind.RELEASE))
    assert Lease.objects.get(pk=ends.pk).state == Lease.State.ENDED
    assert _permitted(_ask(RENTER_USER, line)) == set(_listen_ports(stays).values())
    # Deleting the key: the next login finds nothing.
    assert delete_ssh_key(alice, key.pk)
    assert _ask(RENTER_USER, line) == ""


def test_a_starting_lease_is_not_open_yet_and_a_login_notes_the_key_s_use(
    gateway: Path, tmp_path: Path
) -> None:
    alice = f.make_user("renter")
    line = keygen(tmp_path)
    key = add_ssh_key(alice, line)
    starting = f.start_lease(f.register_host(gpus=(0,)), renter=alice, ports=[22])
    assert starting.tunnels.exists()
    assert _ask(RENTER_USER, line) == ""
    assert renter_ssh.lease_access(starting) is None
    _running(alice, [22])
    _ask(RENTER_USER, line)
    key.refresh_from_db()
    assert key.last_used_at is not None


def test_renter_logins_are_off_without_a_renter_user(
    gateway: Path, tmp_path: Path, settings: Any
) -> None:
    alice = f.make_user("renter")
    line = keygen(tmp_path)
    add_ssh_key(alice, line)
    _running(alice, [22])
    settings.TUNNEL_GATEWAY_RENTER_USER = ""
    assert _ask(RENTER_USER, line) == ""
    assert _ask("", line) == ""


# --- what the renter is shown -----------------------------------------------------------------


def test_the_lease_s_ssh_facts_a_host_block_for_22_and_an_ssh_l_line_for_the_rest(
    gateway: Path, tmp_path: Path
) -> None:
    alice = f.make_user("renter")
    lease = _running(alice, [22, 80, 8888])
    ports = _listen_ports(lease)
    access = renter_ssh.lease_access(lease)
    assert access is not None
    alias = f"cloudgpu-{str(lease.pk)[:8]}"
    assert access.config == (
        f"Host {alias}\n"
        "    HostName 127.0.0.1\n"
        f"    Port {ports[22]}\n"
        "    User root\n"
        "    ProxyJump cloudgpu-ssh@gw.example.net:2200\n"
        f"    HostKeyAlias {alias}\n"
    )
    commands = {fw.port: fw.command for fw in access.other_forwards}
    assert commands == {
        80: f"ssh -N -L 10080:127.0.0.1:{ports[80]} -p 2200 cloudgpu-ssh@gw.example.net",
        8888: f"ssh -N -L 8888:127.0.0.1:{ports[8888]} -p 2200 cloudgpu-ssh@gw.example.net",
    }
    host_key = gateway.read_text().split()
    assert access.known_hosts == [f"[gw.example.net]:2200 {' '.join(host_key)}"]
    # Without port 22: no Host block, the -L lines only.
    web_only = renter_ssh.lease_access(_running(alice, [8080]))
    assert web_only is not None
    assert web_only.config == ""
    assert [fw.port for fw in web_only.other_forwards] == [8080]


def test_the_lease_page_and_the_api_show_the_same_facts(gateway: Path, tmp_path: Path) -> None:
    alice = f.make_user("renter")
    lease = _running(alice, [22, 8888])
    client = Client()
    client.force_login(alice)
    page = client.get(f"/leases/{lease.pk}/").content.decode()
    assert 'id="lease-ssh"' in page
    assert "ProxyJump cloudgpu-ssh@gw.example.net:2200" in page
    assert 'id="ssh-no-keys"' in page  # no key yet: the page says where to add one
    add_ssh_key(alice, keygen(tmp_path))
    panel = client.get(f"/leases/{lease.pk}/panel/").content.decode()
    assert 'id="lease-ssh"' in panel
    assert 'id="ssh-no-keys"' not in panel
    body = client.get(f"/api/v1/leases/{lease.pk}/").json()
    ssh = body["ssh"]
    assert (ssh["gateway_host"], ssh["gateway_port"], ssh["user"]) == (
        "gw.example.net",
        2200,
        RENTER_USER,
    )
    assert {(fw["port"], fw["listen_port"]) for fw in ssh["forwards"]} == set(
        _listen_ports(lease).items()
    )
    assert "HostKeyAlias" in ssh["config"]
    # Once it ends: no SSH section, null in the API.
    lease_services.release_lease(lease.pk)
    assert 'id="lease-ssh"' not in client.get(f"/leases/{lease.pk}/").content.decode()
    assert client.get(f"/api/v1/leases/{lease.pk}/").json()["ssh"] is None


# --- the gateway's sshd configuration -------------------------------------------------------------


def test_sshd_config_gives_renters_local_forwards_only_and_real_sshd_accepts_it(
    tmp_path: Path,
) -> None:
    options = GatewayOptions(folder=tmp_path, hub_url="http://127.0.0.1:8000")
    config = render_sshd_config(options)
    assert "AllowUsers cloudgpu-tunnel cloudgpu-ssh" in config
    block = config[config.index("Match User cloudgpu-ssh") :].splitlines()
    for line in (
        "AllowTcpForwarding local",
        "PermitOpen 127.0.0.1:*",
        "PermitListen none",
        "AllowStreamLocalForwarding no",
        "AllowAgentForwarding no",
        "X11Forwarding no",
        "PermitTunnel no",
        "PermitTTY no",
        "MaxSessions 0",
        "ForceCommand /usr/sbin/nologin",
    ):
        assert f"    {line}" in block
    # The agents' rules stay as they were, before the Match block.
    agents = config[: config.index("Match User")]
    assert "AllowTcpForwarding remote" in agents.splitlines()
    off = render_sshd_config(GatewayOptions(folder=tmp_path, hub_url="x", renter_user=""))
    assert "Match User" not in off
    assert "AllowUsers cloudgpu-tunnel\n" in off
    sshd = Path("/usr/sbin/sshd")
    if not sshd.exists():
        pytest.skip("sshd is not installed: the syntax check needs it")
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(options.host_key)],
        check=True,
        timeout=30,
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    (tmp_path / "sshd_config").write_text(config)
    # -T with a connection spec evaluates the Match block for the renters' login.
    checked = subprocess.run(
        [str(sshd), "-T", "-f", str(tmp_path / "sshd_config"), "-C",
         "user=cloudgpu-ssh,host=h,addr=127.0.0.1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if checked.returncode != 0 and "no such user" in checked.stderr.lower():
        pytest.skip("the renters' login user does not exist here")
    assert checked.returncode == 0, checked.stderr
    effective = checked.stdout.splitlines()
    for line in ("allowtcpforwarding local", "permitlisten none", "permittty no", "maxsessions 0"):
        assert line in effective


# --- the template that takes the account's keys -----------------------------------------------


def test_the_ubuntu_ssh_template_gets_the_account_s_keys_and_the_renter_s_own(
    tmp_path: Path,
) -> None:
    alice = f.make_user("renter")
    template = Template.objects.get(slug="ubuntu-ssh")
    assert template.authorized_keys_env == "PUBLIC_KEY"
    assert "authorized_keys" in " ".join(template.command)
    bare = with_account_keys(lease_spec(template), template, alice)
    assert bare.env["PUBLIC_KEY"] == ""
    old, new = keygen(tmp_path, comment="old"), keygen(tmp_path, comment="new")
    add_ssh_key(alice, old)
    add_ssh_key(alice, new)
    own = keygen(tmp_path, comment="given at rent time")
    spec = with_account_keys(lease_spec(template, env={"PUBLIC_KEY": own}), template, alice)
    assert spec.env["PUBLIC_KEY"].splitlines() == [own, new, old]
    # A template that does not take keys gets none, and another renter's keys never.
    other = Template.objects.exclude(slug="ubuntu-ssh").first()
    assert other is not None
    assert other.authorized_keys_env == ""
    plain = lease_spec(other)
    assert with_account_keys(plain, other, alice) == plain
    assert (
        with_account_keys(lease_spec(template), template, f.make_user("renter")).env["PUBLIC_KEY"]
        == ""
    )
