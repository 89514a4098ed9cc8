"""End to end through the real tunnel gateway: sshd and nginx (``hub.tunnels.gateway``), Daphne,
Celery, Postgres, Redis, a real Docker agent (fake NVML) and a real container serving HTTP, a
streamed response and a WebSocket echo on two ports, reached with the URL's Host header."""

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
from tests.support.fake_gpus import FakeGpuTable, fake_nvml_env
from tests.support.gateway import Gateway, planned_gateway, running_gateway
from tests.support.hub_stack import HubStack, hub_stack
from tests.support.polling import wait_for
from tests.support.sshd import TUNNEL_USER, generate_key

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

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


@pytest.fixture
def people() -> tuple[User, User]:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    return supplier, renter


@contextmanager
def tunnel_world(
    tmp_path: Path, supplier: User, gpus: int = 1
) -> Iterator[tuple[HubStack, Gateway, Path, subprocess.Popen[bytes]]]:
    """Hub, gateway and one Docker agent (fake NVML) whose host is online."""
    table = FakeGpuTable.create(tmp_path / "gpus.json", gpu_count=gpus)
    env = agent_env(**fake_nvml_env(table.path))
    with (
        planned_gateway(tmp_path) as gateway,
        hub_stack(tmp_path, **gateway.hub_settings()) as stack,
        running_gateway(gateway, stack.url(), timeout_s=EDGE_TIMEOUT_S),
    ):
        token = stack.manage(
            "hub", "token", "create", "--owner", supplier.username, "--default-price", "0"
        )
        state = tmp_path / "agent"
        locks = tmp_path / "locks"
        locks.mkdir()
        result = configure(
            state, stack.url(), token, "--gpu-devices", "none", "--lock-dir", str(locks),
            env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        with running_agent(state, tmp_path / "agent.log", env=env) as agent:
            wait_for(
                lambda: Host.objects.filter(owner=supplier, status="online").first(),
                timeout_s=60,
                what="host online",
            )
            yield stack, gateway, state, agent


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


def _tunnels_up(lease: Lease) -> dict[int, Tunnel]:
    def up() -> dict[int, Tunnel] | None:
        tunnels = {t.container_port: t for t in Tunnel.objects.filter(lease=lease)}
        return tunnels if tunnels and all(t.state == "up" for t in tunnels.values()) else None

    return wait_for(up, timeout_s=60, what="the lease's tunnels to be up")


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


def test_two_ports_websocket_streaming_refusals_recovery_and_release(
    people: tuple[User, User], tmp_path: Path, docker_client: object, tunnel_app_image: str
) -> None:
    supplier, renter = people
    with tunnel_world(tmp_path, supplier, gpus=2) as (stack, gateway, state, agent):
        lease = _rent(stack, renter, 0, "--port", "8080", "--port", "8081")
        other = _rent(stack, renter, 1, "--port", "8080")
        try:
            tunnels = _tunnels_up(lease)
            other_tunnel = _tunnels_up(other)[8080]
            web, ws = tunnels[8080], tunnels[8081]
            assert web.public_id != ws.public_id
            shown = stack.manage("hub", "lease", "show", str(lease.pk))
            assert f"http://{web.public_id}-i.tunnels.test/" in shown

            # Both ports, through the edge, by Host header.
            assert gateway.get(web.public_id).text == "port 8080 answers\n"
            assert gateway.get(ws.public_id).text == "port 8081 answers\n"

            # A WebSocket through edge and tunnel: websocketd echoes each line.
            with socket.create_connection(("127.0.0.1", gateway.http_port), timeout=10) as sock:
                url = f"ws://{gateway.host(ws.public_id)}/"
                with ws_connect(url, sock=sock, open_timeout=10) as conn:
                    for text in ("hello", "through the tunnel"):
                        conn.send(text)
                        assert conn.recv(timeout=10).strip() == text

            # Streamed for longer than the edge's idle limit, never quiet that long: whole.
            streamed = gateway.get(web.public_id, "/cgi-bin/stream", timeout=60)
            assert streamed.status_code == 200
            assert "tick 8" in streamed.text
            assert "done after" in streamed.text
            # The same limit does apply: a response quiet for longer is cut.
            try:
                cut = gateway.get(web.public_id, "/cgi-bin/silent", timeout=60).text
            except httpx.HTTPError:
                cut = "start (connection cut)"
            assert "start" in cut
            assert "end" not in cut

            # Unknown ids get the 404 page.
            unknown = gateway.get("nosuchtunnel")
            assert unknown.status_code == 404
            assert "No service at this address" in unknown.text

            # The gateway's sshd: a registered key may listen on its own ports only.
            key = _copy_key(state, lease, tmp_path / "lease-key")
            refused = _ssh(
                gateway, key, "-N", "-R", f"127.0.0.1:{other_tunnel.listen_port}:127.0.0.1:9",
                "127.0.0.1",
            )  # fmt: skip
            assert refused.returncode != 0
            assert "remote port forwarding failed" in refused.stderr
            stranger = tmp_path / "stranger"
            generate_key(stranger)
            denied = _ssh(
                gateway,
                stranger,
                "-N",
                "-R",
                f"127.0.0.1:{web.listen_port}:127.0.0.1:9",
                "127.0.0.1",
            )
            assert denied.returncode != 0
            assert "Permission denied" in denied.stderr
            shell = _ssh(gateway, key, "127.0.0.1", "id")
            assert shell.returncode != 0
            assert "uid=" not in shell.stdout

            # -L with a registered key: the listener is the client's, the gateway opens nothing.
            local = free_port()
            with subprocess.Popen(
                [
                    "ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes",
                    "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                    "-o", "UserKnownHostsFile=/dev/null", "-p", str(gateway.ssh_port),
                    "-l", TUNNEL_USER, "-N",
                    "-L", f"127.0.0.1:{local}:127.0.0.1:{stack.web_ports[0]}", "127.0.0.1",
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

            # The tunnel's ssh dies while the agent cannot restart it: the edge shows 502
            # naming the lease state; once the agent runs again the URL works by itself.
            (ssh_process,) = _ssh_processes(lease)
            os.kill(agent.pid, signal.SIGSTOP)
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
                os.kill(agent.pid, signal.SIGCONT)
            wait_for(
                lambda: gateway.get(web.public_id).status_code == 200,
                timeout_s=60,
                what="the tunnel to come back",
            )
            assert gateway.get(ws.public_id).text == "port 8081 answers\n"

            # Release: the URL answers 404, the key logs in nowhere, no ssh is left.
            stack.manage("hub", "lease", "release", str(lease.pk))
            wait_for(
                lambda: Lease.objects.get(pk=lease.pk).state == "ended", timeout_s=60, what="ended"
            )
            assert gateway.get(web.public_id).status_code == 404
            after = _ssh(
                gateway, key, "-N", "-R", f"127.0.0.1:{web.listen_port}:127.0.0.1:9", "127.0.0.1"
            )
            assert after.returncode != 0
            assert "Permission denied" in after.stderr
            wait_for(lambda: not _ssh_processes(lease), timeout_s=30, what="the ssh to stop")
            assert not (state / "tunnels" / str(lease.pk)).exists()
            assert gateway.get(other_tunnel.public_id).text == "port 8080 answers\n"
        finally:
            for leased in (lease, other):
                for container in docker_client.containers.list(  # type: ignore[attr-defined]
                    all=True, filters={"label": f"cloudgpu.lease={leased.pk}"}
                ):
                    container.remove(force=True)
    access_log = gateway.access_log.read_text()
    assert f"{web.public_id}-i.tunnels.test/cgi-bin/stream" in access_log


def test_a_protected_url_needs_the_lease_token(
    people: tuple[User, User], tmp_path: Path, docker_client: object, tunnel_app_image: str
) -> None:
    supplier, renter = people
    with tunnel_world(tmp_path, supplier) as (stack, gateway, _state, _agent):
        lease = _rent(stack, renter, 0, "--port", "8080", "--protect")
        try:
            web = _tunnels_up(lease)[8080]
            bare = gateway.get(web.public_id)
            assert bare.status_code == 401
            assert "This service is protected" in bare.text
            forged = gateway.get(web.public_id, headers={"Authorization": "Bearer cgpa_forged"})
            assert forged.status_code == 401

            token = stack.manage("hub", "lease", "access-token", str(lease.pk))
            assert token.startswith("cgpa_")
            bearer = gateway.get(web.public_id, headers={"Authorization": f"Bearer {token}"})
            assert bearer.text == "port 8080 answers\n"

            # A browser: the form trades the token for a cookie on the tunnel's own host.
            with httpx.Client(
                base_url=f"http://127.0.0.1:{gateway.http_port}",
                headers={"Host": gateway.host(web.public_id)},
                timeout=30,
            ) as browser:
                form = browser.get("/__cloudgpu/access")
                assert form.status_code == 200
                assert 'name="token"' in form.text
                wrong = browser.post("/__cloudgpu/access", data={"token": "cgpa_nope"})
                assert wrong.status_code == 401
                opened = browser.post("/__cloudgpu/access", data={"token": token})
                assert opened.status_code == 302
                assert "httponly" in opened.headers["set-cookie"].lower()
                assert browser.get("/").text == "port 8080 answers\n"

            # Another lease's token opens nothing here.
            other_token = "cgpa_" + token.split("_", 1)[1][::-1]
            assert (
                gateway.get(web.public_id, headers={"X-CloudGPU-Access": other_token}).status_code
                == 401
            )
        finally:
            for container in docker_client.containers.list(  # type: ignore[attr-defined]
                all=True, filters={"label": f"cloudgpu.lease={lease.pk}"}
            ):
                container.remove(force=True)
    logs = stack.log_text() + gateway.access_log.read_text()
    assert token not in logs
