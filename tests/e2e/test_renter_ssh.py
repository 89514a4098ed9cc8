"""Renters' SSH through the real tunnel gateway (sshd asking the hub), Daphne, Celery, a real
Docker agent and real containers: a renter's account key reaches their own running lease's
declared ports with ``ssh -W`` (what ``ProxyJump`` / ``ssh -J`` does) and ``ssh -N -L``, and every
refusal holds: another renter's lease, an undeclared port, ``-R``, a shell on the gateway, a
deleted key, an ended lease.

The leases' containers are busybox with httpd on port 22 and 5432 (different pages), so "any TCP
port" is proved by bytes through the forward; port 22 is an HTTP server here, not sshd, so the
SSH handshake with the container itself is not part of this test (the ``-W`` stream is the
same one ``ssh -J`` would speak SSH over). The world (hub, gateway, agent, two leases) is shared
by the module like tests/e2e/test_tunnels.py's; the tests run in file order and the last ones
end things (a key deleted, a lease released)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from hub.accounts.api_tokens import create_api_token
from hub.accounts.models import User
from hub.accounts.ssh_keys import add_ssh_key
from hub.catalog.models import Template
from hub.leases.models import Lease
from hub.lib.ports import free_port, wait_for_port
from hub.suppliers.models import Host
from hub.tunnels.models import Tunnel
from tests.e2e.test_tunnels import tunnel_world
from tests.support.db import flush_and_reseed
from tests.support.gateway import Gateway
from tests.support.hub_stack import HubStack
from tests.support.polling import wait_for
from tests.support.sshd import RENTER_USER, TUNNEL_USER, generate_key
from tests.support.sshd_image import COMMAND as SSHD_COMMAND
from tests.support.sshd_image import build_sshd_image

pytestmark = [pytest.mark.django_db, pytest.mark.docker]

_SERVE = (
    "mkdir -p /p22 /p5432 && echo 'port 22 answers' > /p22/index.html && "
    "echo 'port 5432 answers' > /p5432/index.html && "
    "httpd -p 22 -h /p22 && exec httpd -f -p 5432 -h /p5432"
)
REQUEST = "GET / HTTP/1.0\r\nHost: x\r\n\r\n"


@pytest.fixture(scope="module")
def db_access(django_db_setup: None, django_db_blocker: object) -> Iterator[None]:
    """The test database for the module's fixtures and tests, flushed once at its end (the
    seeded catalogue put back), as in tests/e2e/test_tunnels.py."""
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        try:
            yield
        finally:
            flush_and_reseed()


@dataclass
class Renter:
    user: User
    key: Path  # private key file; its .pub is on the account


@dataclass
class World:
    stack: HubStack
    gateway: Gateway
    folder: Path
    alice: Renter
    bob: Renter
    alice_lease: Lease  # ports 22 and 5432
    bob_lease: Lease  # port 5432
    alice_sshd_lease: Lease  # a real sshd on port 22, from a template that gets her keys
    # Alice's API token (read, leases), made with the world: a test's own writes stay in its
    # rolled-back transaction, unseen by the hub, so tests change things through the hub.
    alice_token: str

    def api(self, method: str, path: str) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.stack.url()}/api/v1/{path}",
            headers={"Authorization": f"Bearer {self.alice_token}"},
            timeout=30,
        )

    def listen(self, lease: Lease, port: int) -> int:
        return Tunnel.objects.get(lease=lease, container_port=port).listen_port


def _renter(folder: Path, name: str) -> Renter:
    user = User.objects.create_user(username=f"{name}-{uuid.uuid4().hex[:6]}")
    key = folder / f"{name}-key"
    add_ssh_key(user, generate_key(key, f"{name}@laptop"))
    return Renter(user, key)


def _rent(stack: HubStack, renter: User, gpu: int, image: str, *ports: int) -> Lease:
    (host_id,) = Host.objects.filter(status="online").values_list("pk", flat=True)
    port_args = [arg for port in ports for arg in ("--port", str(port))]
    lease_id = stack.manage(
        "hub", "lease", "start", "--renter", renter.username, "--host", str(host_id),
        "--gpus", str(gpu), "--image", image, *port_args, "--command", "sh", "-c", _SERVE,
    ).splitlines()[0]  # fmt: skip

    def settled() -> Lease | None:
        lease = Lease.objects.get(pk=lease_id)
        return lease if lease.state in ("running", "failed", "ended") else None

    lease = wait_for(settled, timeout_s=120, what="the lease to run")
    assert lease.state == "running", lease.failure_reason
    wait_for(
        lambda: all(t.state == "up" for t in Tunnel.objects.filter(lease=lease)),
        timeout_s=60,
        what="the lease's tunnels to be up",
    )
    return lease


# Short here, so a test can see a renter connection end at its limit (the gateway default is
# 3300 s, under the hub's 3600 s port quarantine); every other test's ssh is over in seconds.
RENTER_MAX_CONNECTION_S = 20


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
    db_access: None,
    busybox_image: str,
    docker_client: object,
) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("renter-ssh")
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    alice, bob = _renter(folder, "alice"), _renter(folder, "bob")
    host_key = folder / "sshd-host-key"
    generate_key(host_key, "sshd in the rental")
    template = Template.objects.create(
        slug=f"test-sshd-{uuid.uuid4().hex[:6]}",
        name="sshd (test)",
        image=build_sshd_image(docker_client, busybox_image, host_key),
        ports=[22],
        command=["sh", "-c", SSHD_COMMAND],
        authorized_keys_env="PUBLIC_KEY",
    )
    with tunnel_world(
        folder, supplier, gpus=3, renter_max_connection_s=RENTER_MAX_CONNECTION_S
    ) as (stack, gateway, _state, _agent):
        try:
            alice_lease = _rent(stack, alice.user, 0, busybox_image, 22, 5432)
            bob_lease = _rent(stack, bob.user, 1, busybox_image, 5432)
            _, token = create_api_token(alice.user, "e2e", ["read", "leases"])
            (host_id,) = Host.objects.filter(status="online").values_list("pk", flat=True)
            # Through the API, as a script would: the template adds her account's keys.
            answer = httpx.post(
                f"{stack.url()}/api/v1/leases/",
                json={"host_id": host_id, "gpu_indices": [2], "template": template.slug},
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
            )
            assert answer.status_code == 201, answer.text
            sshd_lease = wait_for(
                lambda: Lease.objects.filter(
                    pk=answer.json()["id"], state__in=["running", "failed", "ended"]
                ).first(),
                timeout_s=120,
                what="the sshd rental to run",
            )
            assert sshd_lease.state == "running", sshd_lease.failure_reason
            yield World(
                stack, gateway, folder, alice, bob, alice_lease, bob_lease, sshd_lease, token
            )
        finally:
            # Only this world's rentals' containers: the Docker engine is shared with whatever
            # else runs on the machine (other tests, a soak).
            for lease_id in Lease.objects.filter(renter__in=[alice.user, bob.user]).values_list(
                "pk", flat=True
            ):
                for container in docker_client.containers.list(  # type: ignore[attr-defined]
                    all=True, filters={"label": f"cloudgpu.lease={lease_id}"}
                ):
                    container.remove(force=True)


def _ssh(
    world: World, key: Path, *args: str, user: str = RENTER_USER, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The OpenSSH client against the gateway, as a renter (or an attacker) would run it."""
    return subprocess.run(
        [
            "ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes",
            "-o", "IdentityAgent=none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "ExitOnForwardFailure=yes",
            "-o", "ConnectTimeout=10", "-p", str(world.gateway.ssh_port), "-l", user,
            *args,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )  # fmt: skip


def _through(world: World, key: Path, port: int) -> subprocess.CompletedProcess[str]:
    """An HTTP request over ``ssh -W 127.0.0.1:<port>``: the stream ProxyJump opens."""
    return _ssh(world, key, "-W", f"127.0.0.1:{port}", "127.0.0.1", stdin=REQUEST)


# --- what works -------------------------------------------------------------------------------


def test_the_renter_s_key_reaches_port_22_of_their_lease_as_proxyjump_does(world: World) -> None:
    done = _through(world, world.alice.key, world.listen(world.alice_lease, 22))
    assert done.returncode == 0, done.stderr
    assert "port 22 answers" in done.stdout


def test_the_renter_logs_in_to_a_rental_running_sshd_with_the_key_on_their_account(
    world: World,
) -> None:
    """ssh -J as the lease page's Host block says: the jump to the gateway as cloudgpu-ssh, then
    a real SSH login to the rental's sshd, with the key the template put there."""
    listen = world.listen(world.alice_sshd_lease, 22)
    common = [
        "-F", "/dev/null", "-i", str(world.alice.key), "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null",
    ]  # fmt: skip
    gateway = [f"{RENTER_USER}@127.0.0.1"]
    jump = " ".join(["ssh", *common, "-p", str(world.gateway.ssh_port), "-W", "%h:%p", *gateway])
    rental = ["-o", f"ProxyCommand={jump}", "-p", str(listen), "root@127.0.0.1"]
    done = subprocess.run(
        ["ssh", *common, *rental, "echo logged-in-$((6*7)) as $(id -u)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "logged-in-42 as 0" in done.stdout
    # Bob's key is not in Alice's rental.
    refused = subprocess.run(
        ["ssh", *common[:2], "-i", str(world.bob.key), *common[4:], *rental, "true"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode != 0


def _local_forward(world: World, local: int, listen: int) -> subprocess.Popen[bytes]:
    """Alice's ``ssh -N -L local:127.0.0.1:listen`` through the gateway, running."""
    argv = [
        "ssh", "-F", "/dev/null", "-i", str(world.alice.key), "-o", "IdentitiesOnly=yes",
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null", "-o", "ExitOnForwardFailure=yes",
        "-o", "ServerAliveInterval=2",
        "-p", str(world.gateway.ssh_port), "-l", RENTER_USER, "-N",
        "-L", f"127.0.0.1:{local}:127.0.0.1:{listen}", "127.0.0.1",
    ]  # fmt: skip
    return subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def test_ssh_l_reaches_another_declared_port(world: World) -> None:
    local = free_port()
    listen = world.listen(world.alice_lease, 5432)
    with _local_forward(world, local, listen) as forward:
        try:
            assert wait_for_port(local, timeout_s=30)
            assert httpx.get(f"http://127.0.0.1:{local}/", timeout=10).text == "port 5432 answers\n"
        finally:
            forward.terminate()
            forward.communicate(timeout=30)


def test_a_renter_connection_ends_at_its_age_limit(world: World) -> None:
    """sshd fixes a login's permitopen list at login: a connection kept open past the hub's port
    quarantine could reach a port handed to another lease since. The gateway ends renter
    connections before that (here after RENTER_MAX_CONNECTION_S)."""
    local = free_port()
    listen = world.listen(world.alice_lease, 5432)
    with _local_forward(world, local, listen) as forward:
        try:
            assert wait_for_port(local, timeout_s=30)
            assert httpx.get(f"http://127.0.0.1:{local}/", timeout=10).status_code == 200
            wait_for(
                lambda: forward.poll() is not None,
                timeout_s=RENTER_MAX_CONNECTION_S + 30,
                what="the gateway to end the connection at its age limit",
            )
        finally:
            if forward.poll() is None:
                forward.terminate()
            forward.communicate(timeout=30)
    assert "renter connection(s) at their age limit" in world.gateway.log.read_text()


def test_the_lease_page_s_host_block_names_the_gateway_and_the_listen_port(world: World) -> None:
    """Asked of the running hub (its settings name the gateway), as a script would."""
    body = world.api("GET", f"leases/{world.alice_lease.pk}/").json()
    ssh = body["ssh"]
    assert ssh["user"] == RENTER_USER
    assert ssh["gateway_port"] == world.gateway.ssh_port
    assert f"Port {world.listen(world.alice_lease, 22)}" in ssh["config"]
    assert f"ProxyJump {RENTER_USER}@127.0.0.1:{world.gateway.ssh_port}" in ssh["config"]


# --- refusals -----------------------------------------------------------------------------------


def test_another_renter_s_lease_port_is_refused(world: World) -> None:
    refused = _through(world, world.alice.key, world.listen(world.bob_lease, 5432))
    assert refused.returncode != 0
    assert "port 5432 answers" not in refused.stdout
    assert "prohibited" in refused.stderr
    # And the other way round: bob's key opens nothing of alice's.
    refused = _through(world, world.bob.key, world.listen(world.alice_lease, 22))
    assert refused.returncode != 0
    assert "prohibited" in refused.stderr


def test_an_undeclared_port_and_any_other_address_are_refused(world: World) -> None:
    # A real listener on the gateway's loopback that is no tunnel: the hub's own web port.
    hub_port = world.stack.web_ports[0]
    for target in (f"127.0.0.1:{hub_port}", f"localhost:{world.listen(world.alice_lease, 22)}"):
        refused = _ssh(world, world.alice.key, "-W", target, "127.0.0.1", stdin=REQUEST)
        assert refused.returncode != 0, target
        assert "prohibited" in refused.stderr, target
        assert "HTTP/" not in refused.stdout


def test_a_remote_forward_is_refused(world: World) -> None:
    refused = _ssh(
        world, world.alice.key, "-N", "-R", f"127.0.0.1:{free_port()}:127.0.0.1:9", "127.0.0.1"
    )
    assert refused.returncode != 0
    assert "remote port forwarding failed" in refused.stderr


def test_no_shell_or_command_on_the_gateway(world: World) -> None:
    for args in (("127.0.0.1", "id"), ("-tt", "127.0.0.1"), ("127.0.0.1",)):
        shell = _ssh(world, world.alice.key, *args, stdin="id\nexit\n")
        assert shell.returncode != 0, args
        assert "uid=" not in shell.stdout


def test_a_renter_s_key_is_no_agent_key(world: World) -> None:
    """The agents' login would allow -R: a renter's key gets nothing there."""
    denied = _ssh(
        world, world.alice.key, "-N",
        "-R", f"127.0.0.1:{world.listen(world.alice_lease, 22)}:127.0.0.1:9", "127.0.0.1",
        user=TUNNEL_USER,
    )  # fmt: skip
    assert denied.returncode != 0
    assert "Permission denied" in denied.stderr


def test_an_unknown_key_is_denied(world: World) -> None:
    stranger = world.folder / "stranger"
    generate_key(stranger)
    denied = _through(world, stranger, world.listen(world.alice_lease, 22))
    assert denied.returncode != 0
    assert "Permission denied" in denied.stderr


# --- the last two change the world ------------------------------------------------------------


def test_a_deleted_key_is_refused_at_the_next_login(world: World) -> None:
    listen = world.listen(world.alice_lease, 22)
    assert _through(world, world.alice.key, listen).returncode == 0
    (key,) = world.api("GET", "ssh-keys/").json()
    assert world.api("DELETE", f"ssh-keys/{key['id']}/").status_code == 204
    denied = _through(world, world.alice.key, listen)
    assert denied.returncode != 0
    assert "Permission denied" in denied.stderr


def test_an_ended_lease_is_refused(world: World) -> None:
    listen = world.listen(world.bob_lease, 5432)
    assert "port 5432 answers" in _through(world, world.bob.key, listen).stdout
    world.stack.manage("hub", "lease", "release", str(world.bob_lease.pk))
    wait_for(
        lambda: Lease.objects.get(pk=world.bob_lease.pk).state == "ended",
        timeout_s=60,
        what="the lease to end",
    )
    denied = _through(world, world.bob.key, listen)
    assert denied.returncode != 0
    assert "Permission denied" in denied.stderr  # no running lease: no line, no login
