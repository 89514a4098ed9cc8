"""End to end through the real tunnel gateway: sshd and nginx (``hub.tunnels.gateway``), Daphne,
Celery, Postgres, Redis, a real Docker agent (fake NVML) and a real container serving HTTP, a
streamed response and a WebSocket echo on two ports, reached with the URL's Host header.

Starting that world takes most of a minute, so the module shares one (``world``, module-scoped)
and three leases on it: ``web_app`` (ports 8080 and 8081), ``neighbour`` (8080) and
``protected`` (8080, ``--protect``). The tests run in file order; only the last two of the
``web_app`` tests change it (one stops the agent for a while and checks that the tunnel comes
back, the last releases the lease), and the ``protected`` tests only read. Because the world
outlives a test, its rows are made by module fixtures through ``db_access`` (open for the
module, flushed once at its end), not under ``django_db(transaction=True)``, whose flush after
every test would pull the hub's rows from under it."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from websockets.sync.client import connect as ws_connect

from hub.accounts.models import User
from hub.leases.models import Lease
from hub.lib.ports import free_port, wait_for_port
from hub.suppliers.models import Host
from hub.tunnels.models import Tunnel
from tests.support.agents import agent_env, configure, running_agent
from tests.support.db import flush_and_reseed
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.gateway import Gateway, planned_gateway, running_gateway
from tests.support.hub_stack import HubStack, hub_stack
from tests.support.polling import wait_for
from tests.support.sshd import TUNNEL_USER, generate_key

# Plain django_db: each test in a transaction rolled back after it (the tests only read); the
# world's rows come from module fixtures, committed before that, and flushed by db_access.
pytestmark = [pytest.mark.django_db, pytest.mark.docker]

APP_IMAGE = "cloudgpu-test/tunnel-app:latest"
EDGE_TIMEOUT_S = 4  # the edge's idle limit in these tests; the default is 900 s
WEBSOCKETD = Path("/usr/bin/websocketd")

# Port 8080: busybox httpd with a page and two CGI streams; port 8081: websocketd echoing every
# line it gets (cat), and a page of its own.
_START = """#!/bin/sh
httpd -f -p 8080 -h /www &
exec websocketd --port=8081 --staticdir=/www2 /bin/cat
"""
_STREAM = f"""#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
for n in 1 2 3 4 5 6 7 8; do echo "tick $n"; sleep 1; done
echo "done after more than {EDGE_TIMEOUT_S} s"
"""
_SILENT = f"""#!/bin/sh
printf 'Content-Type: text/plain\\r\\n\\r\\n'
echo "start"
sleep {EDGE_TIMEOUT_S + 3}
echo "end"
"""
# Nothing at all, not even headers, for longer than the limit (a long generation's reply).
_HUSH = f"""#!/bin/sh
sleep {EDGE_TIMEOUT_S + 3}
printf 'Content-Type: text/plain\\r\\n\\r\\n'
echo "too late"
"""


@pytest.fixture(scope="session")
def tunnel_app_image(docker_client: object) -> str:
    """busybox plus Debian's websocketd (and the libc it links), built locally."""
    if not WEBSOCKETD.is_file():
        pytest.fail("websocketd is missing (apt install websocketd); .ci/run installs it")
    files: dict[str, tuple[bytes, int]] = {
        "busybox": (Path("/bin/busybox").read_bytes(), 0o755),
        "websocketd": (WEBSOCKETD.read_bytes(), 0o755),
        "libc.so.6": (Path("/lib/x86_64-linux-gnu/libc.so.6").read_bytes(), 0o755),
        "ld-linux-x86-64.so.2": (Path("/lib64/ld-linux-x86-64.so.2").read_bytes(), 0o755),
        "start.sh": (_START.encode(), 0o755),
        "stream": (_STREAM.encode(), 0o755),
        "silent": (_SILENT.encode(), 0o755),
        "hush": (_HUSH.encode(), 0o755),
        "index8080.html": (b"port 8080 answers\n", 0o644),
        "index8081.html": (b"port 8081 answers\n", 0o644),
    }
    dockerfile = b"""FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
COPY libc.so.6 /lib/x86_64-linux-gnu/libc.so.6
COPY ld-linux-x86-64.so.2 /lib64/ld-linux-x86-64.so.2
COPY websocketd /bin/websocketd
COPY start.sh /app/start.sh
COPY index8080.html /www/index.html
COPY stream /www/cgi-bin/stream
COPY silent /www/cgi-bin/silent
COPY hush /www/cgi-bin/hush
COPY index8081.html /www2/index.html
CMD ["/bin/sh", "/app/start.sh"]
"""
    files["Dockerfile"] = (dockerfile, 0o644)
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    docker_client.images.build(fileobj=context, custom_context=True, tag=APP_IMAGE, rm=True)  # type: ignore[attr-defined]
    return APP_IMAGE


def _rent(stack: HubStack, renter: User, gpu: int, *args: str) -> Lease:
    (host_id,) = Host.objects.filter(status="online").values_list("pk", flat=True)
    lease_id = stack.manage(
        "hub", "lease", "start", "--renter", renter.username, "--host", str(host_id),
        "--gpus", str(gpu), "--image", APP_IMAGE, *args,
    ).splitlines()[0]  # fmt: skip

    def settled() -> Lease | None:
        lease = Lease.objects.get(pk=lease_id)
        return lease if lease.state in ("running", "failed", "ended") else None

    lease = wait_for(settled, timeout_s=120, what="the lease to run")
    assert lease.state == "running", lease.failure_reason
    return lease


def _ssh_processes(lease: Lease) -> list[psutil.Process]:
    marker = f"{lease.pk}/id_ed25519"
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "ssh" and any(marker in part for part in cmdline):
            found.append(process)
    return found


def _gone_or_zombie(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _ssh(
    gateway: Gateway, key: Path, *args: str, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """The OpenSSH client as an attacker would use it against the gateway."""
    return subprocess.run(
        [
            "ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes",
            "-o", "IdentityAgent=none", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "ExitOnForwardFailure=yes",
            "-o", "ConnectTimeout=10", "-p", str(gateway.ssh_port), "-l", TUNNEL_USER,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip


def _copy_key(state: Path, lease: Lease, target: Path) -> Path:
    """The lease's private key as the agent made it (the agent deletes it on release)."""
    target.write_bytes((state / "tunnels" / str(lease.pk) / "id_ed25519").read_bytes())
    target.chmod(0o600)
    return target


@pytest.fixture(scope="module")
def db_access(django_db_setup: None, django_db_blocker: object) -> Iterator[None]:
    """The test database for this module's tests and fixtures alike, flushed once at the end
    (as ``transaction=True`` would after each test) so later tests start from an empty one."""
    with django_db_blocker.unblock():  # type: ignore[attr-defined]
        try:
            yield
        finally:
            # Not a bare flush: it would take the seeded catalogue with it, and pytest-django
            # runs this module among the non-transactional tests, before those that need it.
            flush_and_reseed()


@pytest.fixture(scope="module")
def people(db_access: None) -> tuple[User, User]:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    return supplier, renter


@contextmanager
def tunnel_world(
    tmp_path: Path, supplier: User, gpus: int = 1, renter_max_connection_s: int = 3300
) -> Iterator[tuple[HubStack, Gateway, Path, subprocess.Popen[bytes]]]:
    """Hub, gateway and one Docker agent (fake NVML) whose host is online."""
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=gpus)
    env = agent_env(**fake_nvml_env(table.path))
    with (
        planned_gateway(tmp_path) as gateway,
        hub_stack(tmp_path, **gateway.hub_settings()) as stack,
        running_gateway(
            gateway,
            stack.url(),
            timeout_s=EDGE_TIMEOUT_S,
            renter_max_connection_s=renter_max_connection_s,
        ),
    ):
        token = stack.manage(
            "hub", "token", "create", "--owner", supplier.username, "--default-price", "0"
        )
        state = tmp_path / "agent"
        locks = tmp_path / "locks"
        locks.mkdir()
        result = configure(
            state, stack.url(), token, "--gpu-devices", "none", "--lock-dir", str(locks),
            "--allow-local-images", env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        with running_agent(state, tmp_path / "agent.log", env=env) as agent:
            wait_for(
                lambda: Host.objects.filter(owner=supplier, status="online").first(),
                timeout_s=60,
                what="host online",
            )
            yield stack, gateway, state, agent


@dataclass
class World:
    stack: HubStack
    gateway: Gateway
    state: Path  # the agent's state folder
    agent: subprocess.Popen[bytes]
    folder: Path  # logs and scratch files
    renter: User


@dataclass
class Rental:
    lease: Lease
    tunnels: dict[int, Tunnel]  # by container port


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, people: tuple[User, User], tunnel_app_image: str
) -> Iterator[World]:
    """One hub, gateway and agent (three fake GPUs, one per lease below) for the module."""
    supplier, renter = people
    folder = tmp_path_factory.mktemp("tunnel-world")
    with tunnel_world(folder, supplier, gpus=3) as (stack, gateway, state, agent):
        yield World(stack, gateway, state, agent, folder, renter)


@contextmanager
def _rented(world: World, docker_client: object, gpu: int, *args: str) -> Iterator[Rental]:
    lease = _rent(world.stack, world.renter, gpu, *args)
    try:
        # Running means reachable (issue 17 item 3): its tunnels are up as it turns running,
        # with no wait.
        tunnels = {t.container_port: t for t in Tunnel.objects.filter(lease=lease)}
        assert tunnels, "a rental with ports has tunnels"
        assert all(t.state == "up" for t in tunnels.values()), {
            port: (t.state, t.detail) for port, t in tunnels.items()
        }
        yield Rental(lease, tunnels)
    finally:
        for container in docker_client.containers.list(  # type: ignore[attr-defined]
            all=True, filters={"label": f"cloudgpu.lease={lease.pk}"}
        ):
            container.remove(force=True)


@pytest.fixture(scope="module")
def web_app(world: World, docker_client: object) -> Iterator[Rental]:
    """The app on GPU 0 with both ports tunnelled."""
    with _rented(world, docker_client, 0, "--port", "8080", "--port", "8081") as rental:
        yield rental


@pytest.fixture(scope="module")
def neighbour(world: World, docker_client: object) -> Iterator[Rental]:
    """Another lease of the same renter on GPU 1, port 8080 only."""
    with _rented(world, docker_client, 1, "--port", "8080") as rental:
        yield rental


@pytest.fixture(scope="module")
def lease_key(world: World, web_app: Rental) -> Path:
    """``web_app``'s private key as the agent made it (the agent deletes it on release)."""
    return _copy_key(world.state, web_app.lease, world.folder / "lease-key")


@pytest.fixture(scope="module")
def protected(world: World, docker_client: object) -> Iterator[Rental]:
    """A ``--protect`` lease on GPU 2: its URL needs the lease's access token."""
    with _rented(world, docker_client, 2, "--port", "8080", "--protect") as rental:
        yield rental


@pytest.fixture(scope="module")
def access_token(world: World, protected: Rental) -> str:
    token = world.stack.manage("hub", "lease", "access-token", str(protected.lease.pk))
    assert token.startswith("cgpa_")
    return token


def _read_until_cut(gateway: Gateway, public_id: str, path: str) -> tuple[int, str, bool]:
    """GET through the edge, keeping what arrives before the edge cuts the response: the
    status, the body received and whether the connection was cut mid-body. Only the body's
    read may end in an error; failing to connect or to get the headers fails the test."""
    received = b""
    cut = False
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "GET",
            f"http://127.0.0.1:{gateway.http_port}{path}",
            headers={"Host": gateway.host(public_id)},
        ) as response,
    ):
        try:
            for chunk in response.iter_bytes():
                received += chunk
        except httpx.RemoteProtocolError:
            cut = True
    return response.status_code, received.decode(errors="replace"), cut


# --- web_app: ports, WebSocket, streaming, the edge's limit ------------------------------------


def test_each_port_gets_its_own_url_shown_by_lease_show(world: World, web_app: Rental) -> None:
    web, ws = web_app.tunnels[8080], web_app.tunnels[8081]
    assert web.public_id != ws.public_id
    shown = world.stack.manage("hub", "lease", "show", str(web_app.lease.pk))
    assert f"http://{web.public_id}-i.tunnels.test/" in shown
    assert f"http://{ws.public_id}-i.tunnels.test/" in shown


def test_both_ports_answer_through_the_edge_by_host_header(world: World, web_app: Rental) -> None:
    assert world.gateway.get(web_app.tunnels[8080].public_id).text == "port 8080 answers\n"
    assert world.gateway.get(web_app.tunnels[8081].public_id).text == "port 8081 answers\n"


def test_a_websocket_echoes_through_edge_and_tunnel(world: World, web_app: Rental) -> None:
    gateway = world.gateway
    with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10) as sock:
        url = f"ws://{gateway.host(web_app.tunnels[8081].public_id)}/"
        with ws_connect(url, sock=sock, open_timeout=10) as conn:
            for text in ("hello", "through the tunnel"):
                conn.send(text)
                assert conn.recv(timeout=10).strip() == text


def test_a_stream_longer_than_the_idle_limit_but_never_quiet_arrives_whole(
    world: World, web_app: Rental
) -> None:
    public_id = web_app.tunnels[8080].public_id
    streamed = world.gateway.get(public_id, "/cgi-bin/stream", timeout=60)
    assert streamed.status_code == 200
    assert "tick 8" in streamed.text
    assert "done after" in streamed.text
    # nginx logs a request once it has finished it on its side, which may be just after the
    # client read the last byte: poll for the line.
    access_log = world.gateway.folder / "logs" / "access.log"
    line = f"{public_id}-i.tunnels.test/cgi-bin/stream"
    wait_for(lambda: line in access_log.read_text(), timeout_s=10, what="the access log line")


def test_a_response_quiet_for_longer_than_the_idle_limit_is_cut(
    world: World, web_app: Rental
) -> None:
    status, body, cut = _read_until_cut(
        world.gateway, web_app.tunnels[8080].public_id, "/cgi-bin/silent"
    )
    assert status == 200
    assert "start" in body  # what came before the quiet arrived
    assert cut, f"the edge did not cut the quiet response; body: {body!r}"
    assert "end" not in body


def test_a_response_quiet_from_its_start_for_longer_than_the_limit_gets_504_saying_so(
    world: World, web_app: Rental
) -> None:
    public_id = web_app.tunnels[8080].public_id
    quiet = world.gateway.get(public_id, "/cgi-bin/hush", timeout=60)
    assert quiet.status_code == 504
    assert f"sent nothing for longer than this address's limit of {EDGE_TIMEOUT_S} s" in quiet.text
    assert "nothing in the container answers" not in quiet.text
    access_log = world.gateway.folder / "logs" / "access.log"
    line = f'"GET {public_id}-i.tunnels.test/cgi-bin/hush" 504'
    wait_for(lambda: line in access_log.read_text(), timeout_s=10, what="the access log line")


def test_a_long_request_leaves_the_edge_s_route_cache_unlocked(
    world: World, web_app: Rental
) -> None:
    """A request whose route came from the cache held that entry until it ended, and nginx
    logged "[alert] ignore long locked inactive cache entry" every inactive period meanwhile."""
    public_id = web_app.tunnels[8080].public_id
    assert world.gateway.get(public_id).status_code == 200  # the route is cached
    streamed = world.gateway.get(public_id, "/cgi-bin/stream", timeout=60)  # read from it
    assert "done after" in streamed.text  # outlasts the cache's inactive time (4 s)
    assert "long locked" not in world.gateway.log.read_text()


def test_an_unknown_id_gets_the_404_page(world: World) -> None:
    unknown = world.gateway.get("nosuchtunnel", "/some/page?key=s3cr3t")
    assert unknown.status_code == 404
    assert "No service at this address" in unknown.text
    # The renter's path is logged (not the hub page's that answered), without its query.
    access_log = world.gateway.folder / "logs" / "access.log"
    line = '"GET nosuchtunnel-i.tunnels.test/some/page" 404'
    wait_for(lambda: line in access_log.read_text(), timeout_s=10, what="the access log line")
    assert "s3cr3t" not in access_log.read_text()


# --- the gateway's sshd -------------------------------------------------------------------------


def test_a_lease_key_may_not_listen_on_another_leases_port(
    world: World, web_app: Rental, neighbour: Rental, lease_key: Path
) -> None:
    refused = _ssh(
        world.gateway, lease_key, "-N",
        "-R", f"127.0.0.1:{neighbour.tunnels[8080].listen_port}:127.0.0.1:9", "127.0.0.1",
    )  # fmt: skip
    assert refused.returncode != 0
    assert "remote port forwarding failed" in refused.stderr


def test_an_unregistered_key_is_denied(world: World, web_app: Rental) -> None:
    stranger = world.folder / "stranger"
    generate_key(stranger)
    denied = _ssh(
        world.gateway, stranger, "-N",
        "-R", f"127.0.0.1:{web_app.tunnels[8080].listen_port}:127.0.0.1:9", "127.0.0.1",
    )  # fmt: skip
    assert denied.returncode != 0
    assert "Permission denied" in denied.stderr


def test_a_lease_key_gets_no_shell(world: World, lease_key: Path) -> None:
    shell = _ssh(world.gateway, lease_key, "127.0.0.1", "id")
    assert shell.returncode != 0
    assert "uid=" not in shell.stdout


def test_local_forwarding_with_a_lease_key_opens_nothing(world: World, lease_key: Path) -> None:
    """With -L the listener is the client's; the gateway refuses to open the connection."""
    local = free_port()
    with subprocess.Popen(
        [
            "ssh", "-F", "/dev/null", "-i", str(lease_key), "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-p", str(world.gateway.ssh_port),
            "-l", TUNNEL_USER, "-N",
            "-L", f"127.0.0.1:{local}:127.0.0.1:{world.stack.web_ports[0]}", "127.0.0.1",
        ],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    ) as forward:  # fmt: skip
        try:
            assert wait_for_port(local, timeout_s=30)
            with pytest.raises(httpx.HTTPError):
                httpx.get(f"http://127.0.0.1:{local}/healthz", timeout=10)
        finally:
            forward.terminate()
            _, err = forward.communicate(timeout=30)
    assert b"prohibited" in err


# --- web_app's last two: they change it -----------------------------------------------------------


def test_a_dead_tunnel_shows_502_then_comes_back_by_itself(world: World, web_app: Rental) -> None:
    """The tunnel's ssh dies while the agent cannot restart it: the edge shows 502 naming the
    lease state; once the agent runs again the URL works by itself."""
    gateway, web = world.gateway, web_app.tunnels[8080]
    (ssh_process,) = _ssh_processes(web_app.lease)
    os.kill(world.agent.pid, signal.SIGSTOP)
    try:
        ssh_process.kill()
        # A zombie until the stopped agent reaps it: dead either way.
        wait_for(lambda: _gone_or_zombie(ssh_process), timeout_s=10, what="ssh to die")
        down = wait_for(
            lambda: (r := gateway.get(web.public_id)).status_code == 502 and r,
            timeout_s=30,
            what="the 502 page",
        )
        assert "Rental state: <strong>running</strong>" in down.text
    finally:
        os.kill(world.agent.pid, signal.SIGCONT)
    wait_for(
        lambda: gateway.get(web.public_id).status_code == 200,
        timeout_s=60,
        what="the tunnel to come back",
    )
    assert gateway.get(web_app.tunnels[8081].public_id).text == "port 8081 answers\n"


def test_release_closes_the_url_the_key_and_the_ssh_but_not_the_neighbours(
    world: World, web_app: Rental, neighbour: Rental, lease_key: Path
) -> None:
    lease, web = web_app.lease, web_app.tunnels[8080]
    world.stack.manage("hub", "lease", "release", str(lease.pk))
    wait_for(lambda: Lease.objects.get(pk=lease.pk).state == "ended", timeout_s=60, what="ended")
    assert world.gateway.get(web.public_id).status_code == 404
    after = _ssh(
        world.gateway, lease_key, "-N",
        "-R", f"127.0.0.1:{web.listen_port}:127.0.0.1:9", "127.0.0.1",
    )  # fmt: skip
    assert after.returncode != 0
    assert "Permission denied" in after.stderr
    wait_for(lambda: not _ssh_processes(lease), timeout_s=30, what="the ssh to stop")
    assert not (world.state / "tunnels" / str(lease.pk)).exists()
    assert world.gateway.get(neighbour.tunnels[8080].public_id).text == "port 8080 answers\n"


# --- protected: the lease's access token --------------------------------------------------------


def test_a_protected_url_refuses_no_token_and_a_forged_one(world: World, protected: Rental) -> None:
    public_id = protected.tunnels[8080].public_id
    bare = world.gateway.get(public_id)
    assert bare.status_code == 401
    assert "This service is protected" in bare.text
    forged = world.gateway.get(public_id, headers={"Authorization": "Bearer cgpa_forged"})
    assert forged.status_code == 401


def test_the_access_token_opens_a_protected_url_as_a_bearer(
    world: World, protected: Rental, access_token: str
) -> None:
    bearer = world.gateway.get(
        protected.tunnels[8080].public_id, headers={"Authorization": f"Bearer {access_token}"}
    )
    assert bearer.text == "port 8080 answers\n"


def test_the_access_form_trades_the_token_for_a_cookie_on_the_tunnels_host(
    world: World, protected: Rental, access_token: str
) -> None:
    with httpx.Client(
        base_url=f"http://127.0.0.1:{world.gateway.http_port}",
        headers={"Host": world.gateway.host(protected.tunnels[8080].public_id)},
        timeout=30,
    ) as browser:
        form = browser.get("/__cloudgpu/access")
        assert form.status_code == 200
        assert 'name="token"' in form.text
        wrong = browser.post("/__cloudgpu/access", data={"token": "cgpa_nope"})
        assert wrong.status_code == 401
        opened = browser.post("/__cloudgpu/access", data={"token": access_token})
        assert opened.status_code == 302
        assert "httponly" in opened.headers["set-cookie"].lower()
        assert browser.get("/").text == "port 8080 answers\n"


def test_a_token_shaped_like_the_leases_but_not_it_opens_nothing(
    world: World, protected: Rental, access_token: str
) -> None:
    other_token = "cgpa_" + access_token.split("_", 1)[1][::-1]
    opened = world.gateway.get(
        protected.tunnels[8080].public_id, headers={"X-CloudGPU-Access": other_token}
    )
    assert opened.status_code == 401


def test_the_access_token_is_in_no_log(world: World, access_token: str) -> None:
    """After the tests above used it every way: the hub's logs and the edge's access log."""
    logs = world.stack.log_text() + (world.gateway.folder / "logs" / "access.log").read_text()
    assert access_token not in logs
