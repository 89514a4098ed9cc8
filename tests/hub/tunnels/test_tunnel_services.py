"""Tunnel services and the gateway's endpoints on the real database: allocation with the
lease, the agent's key, what sshd and the edge are told, access tokens."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from hub.leases import services as lease_services
from hub.leases.models import Command, Lease
from hub.lib.redact import redact
from hub.tunnels import access, services
from hub.tunnels.gateway_config import (
    DEFAULT_TIMEOUT_S,
    GatewayOptions,
    render_nginx_config,
    render_sshd_config,
)
from hub.tunnels.models import Tunnel, TunnelKey
from supplier_agent.protocol import HUB_TO_AGENT, TunnelState, parse_message
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

SECRET = "s" * 40
DOMAIN = "tunnels.test"


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True, timeout=30
    )
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture
def gateway(settings: Any, tmp_path: Path) -> Path:
    """Tunnels on, as a hub with a gateway is configured."""
    host_key = _keygen(tmp_path / "host_key")
    keys_file = tmp_path / "gateway_host_keys"
    keys_file.write_text(f"# the gateway's sshd\n{host_key}\nnot a key\n")
    settings.TUNNEL_DOMAIN = DOMAIN
    settings.TUNNEL_URL_SCHEME = "https"
    settings.TUNNEL_GATEWAY_SSH_HOST = "gw.example.net"
    settings.TUNNEL_GATEWAY_SSH_PORT = 2222
    settings.TUNNEL_GATEWAY_HOST_KEYS_FILE = str(keys_file)
    settings.TUNNEL_GATEWAY_SECRET = SECRET
    return keys_file


def _running(ports: list[int], *, key: str | None, **spec: Any) -> Lease:
    host = f.register_host(gpus=(0,))
    lease = f.start_lease(host, ports=ports, **spec)
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    result: dict[str, Any] = {"container_id": "c0ffee", "ports": {str(p): 41000 for p in ports}}
    if key is not None:
        result["tunnel_public_key"] = key
    assert f.ack(f.command_of(lease, Command.Kind.DOCKER_RUN), result=result)
    lease.refresh_from_db()
    return lease


def _up(lease: Lease) -> None:
    for tunnel in lease.tunnels.all():
        services.record_state(
            lease.host_id,
            TunnelState(lease_id=str(lease.pk), port=tunnel.container_port, state="up"),
        )


# --- allocation and the agent's side ----------------------------------------------------------


def test_each_port_gets_its_own_id_and_gateway_port_and_the_docker_run_carries_them(
    gateway: Path,
) -> None:
    host = f.register_host(gpus=(0,))
    lease = f.start_lease(host, ports=[8080, 8888])
    tunnels = {t.container_port: t for t in lease.tunnels.all()}
    assert set(tunnels) == {8080, 8888}
    assert tunnels[8080].public_id != tunnels[8888].public_id
    assert tunnels[8080].listen_port != tunnels[8888].listen_port
    assert services.public_url(tunnels[8080]) == f"https://{tunnels[8080].public_id}-i.{DOMAIN}/"

    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    run = parse_message(
        json.dumps(f.command_of(lease, Command.Kind.DOCKER_RUN).payload), allowed=HUB_TO_AGENT
    )
    assert run.tunnel is not None
    assert run.tunnel.host == "gw.example.net"
    assert run.tunnel.port == 2222
    assert len(run.tunnel.host_keys) == 1  # the file's comment and garbage line are skipped
    assert {(fw.port, fw.listen_port) for fw in run.tunnel.forwards} == {
        (8080, tunnels[8080].listen_port),
        (8888, tunnels[8888].listen_port),
    }


def test_without_a_gateway_leases_get_no_tunnels(settings: Any) -> None:
    settings.TUNNEL_DOMAIN = ""
    lease = _running([8080], key=None)
    assert not lease.tunnels.exists()
    assert "tunnel" not in f.command_of(lease, Command.Kind.DOCKER_RUN).payload
    assert lease.warnings == []


def test_a_freed_port_is_quarantined_and_an_exhausted_range_is_a_clear_error(
    gateway: Path, settings: Any
) -> None:
    settings.TUNNEL_LISTEN_PORT_MIN = 30000
    settings.TUNNEL_LISTEN_PORT_MAX = 30001
    first = f.start_lease(f.register_host(gpus=(0,)), ports=[80, 81])
    assert sorted(first.tunnels.values_list("listen_port", flat=True)) == [30000, 30001]
    lease_services.release_lease(first.pk)
    assert f.ack(f.command_of(first, Command.Kind.RELEASE))
    assert set(first.tunnels.values_list("state", flat=True)) == {"closed"}
    # Both ports are free again, but a forward an unreachable agent still holds could capture
    # them: within the quarantine no new lease gets them.
    with pytest.raises(lease_services.LeaseError, match="no free port"):
        f.start_lease(f.register_host(gpus=(0,)), ports=[80])
    settings.TUNNEL_PORT_QUARANTINE_S = 0
    Tunnel.objects.update(closed_at=timezone.now() - timedelta(seconds=1))
    later = f.start_lease(f.register_host(gpus=(0,)), ports=[80])
    assert later.tunnels.get().listen_port in (30000, 30001)


def test_the_key_from_the_docker_run_ack_is_kept_with_openssh_s_fingerprint(
    gateway: Path, tmp_path: Path
) -> None:
    key = _keygen(tmp_path / "lease_key")
    lease = _running([8080], key=key + " cloudgpu-lease")
    record = TunnelKey.objects.get(lease=lease)
    listed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(tmp_path / "lease_key.pub")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    assert record.fingerprint == listed
    assert record.public_key == " ".join(key.split()[:2])
    assert lease.warnings == []


@pytest.mark.parametrize(
    ("key", "warning"),
    [(None, "sent no tunnel key"), ("ssh-ed25519 !!!notbase64!!!", "unusable tunnel key")],
)
def test_a_missing_or_bad_key_leaves_the_lease_running_with_a_warning(
    gateway: Path, key: str | None, warning: str
) -> None:
    lease = _running([8080], key=key)
    assert lease.state == Lease.State.RUNNING
    assert any(warning in w for w in lease.warnings)
    assert not TunnelKey.objects.filter(lease=lease).exists()


def test_a_key_two_leases_claim_is_trusted_for_neither_twice(gateway: Path, tmp_path: Path) -> None:
    key = _keygen(tmp_path / "shared")
    _running([8080], key=key)
    second = _running([8080], key=key)
    assert any("another lease's tunnel key" in w for w in second.warnings)
    assert TunnelKey.objects.count() == 1


def test_tunnel_states_come_only_from_the_lease_s_own_host(gateway: Path, tmp_path: Path) -> None:
    lease = _running([8080], key=_keygen(tmp_path / "k"))
    other_host = f.register_host(gpus=(0,))
    message = TunnelState(lease_id=str(lease.pk), port=8080, state="up", detail="")
    services.record_state(other_host.pk, message)
    assert lease.tunnels.get().state == "pending"
    services.record_state(lease.host_id, message)
    assert lease.tunnels.get().state == "up"


# --- what the gateway's sshd is told ----------------------------------------------------------


def test_sshd_gets_exactly_the_lease_s_listen_ports_and_nothing_more(
    gateway: Path, tmp_path: Path
) -> None:
    key = _keygen(tmp_path / "k")
    key_type, blob = key.split()[:2]
    lease = _running([8080, 8081], key=key)
    line = services.authorized_keys("cloudgpu-tunnel", key_type, blob)
    options, rest = line.split(" ", 1)
    ports = sorted(lease.tunnels.values_list("listen_port", flat=True))
    assert options == (
        "restrict,port-forwarding,"
        + ",".join(f'permitlisten="127.0.0.1:{p}"' for p in ports)
        + ',command="/usr/sbin/nologin"'
    )
    assert rest.startswith(f"{key_type} {blob} ")
    # Another login name, another key type with the same blob, an unknown key: nothing.
    assert services.authorized_keys("root", key_type, blob) == ""
    assert services.authorized_keys("cloudgpu-tunnel", "ssh-rsa", blob) == ""
    stranger = _keygen(tmp_path / "stranger").split()[1]
    assert services.authorized_keys("cloudgpu-tunnel", key_type, stranger) == ""
    assert services.authorized_keys("cloudgpu-tunnel", key_type, "%%%") == ""
    # Once the renter stops, the key logs in nowhere, before the agent even answers.
    lease_services.release_lease(lease.pk)
    assert services.authorized_keys("cloudgpu-tunnel", key_type, blob) == ""


# --- what the edge is told ----------------------------------------------------------------------


def test_routes_for_unknown_down_up_and_ended_tunnels(gateway: Path, tmp_path: Path) -> None:
    lease = _running([8080], key=_keygen(tmp_path / "k"))
    tunnel = lease.tunnels.get()
    host = f"{tunnel.public_id}-i.{DOMAIN}"
    assert services.route(f"zzzzzzzzzzzz-i.{DOMAIN}", []).status == 404
    assert services.route(f"{tunnel.public_id}-i.example.org", []).status == 404
    assert services.route("not a host", []).status == 404
    down = services.route(host, [])
    assert (down.status, down.lease_state) == (502, "running")
    _up(lease)
    assert services.route(host.upper() + ":443", []).listen_port == tunnel.listen_port
    lease_services.release_lease(lease.pk)
    assert services.route(host, []).status == 502  # stopping: no longer routed
    assert f.ack(f.command_of(lease, Command.Kind.RELEASE))
    assert services.route(host, []).status == 404


def test_a_protected_lease_needs_its_own_unexpired_token(
    gateway: Path, tmp_path: Path, settings: Any
) -> None:
    lease = _running([8080], key=_keygen(tmp_path / "k"), access_protected=True)
    other = _running([8080], key=_keygen(tmp_path / "k2"), access_protected=True)
    _up(lease)
    host = f"{lease.tunnels.get().public_id}-i.{DOMAIN}"
    token = access.issue(lease.pk)
    assert services.route(host, []).status == 401
    assert services.route(host, ["cgpa_forged", access.issue(other.pk)]).status == 401
    assert services.route(host, ["cgpa_forged", token]).status == 200
    settings.TUNNEL_ACCESS_TOKEN_MAX_AGE_S = -1
    assert services.route(host, [token]).status == 401


def test_the_gateway_endpoints_need_the_shared_secret_and_answer_the_edge(
    gateway: Path, tmp_path: Path
) -> None:
    key = _keygen(tmp_path / "k")
    lease = _running([8080], key=key)
    _up(lease)
    tunnel = lease.tunnels.get()
    host = f"{tunnel.public_id}-i.{DOMAIN}"
    client = Client()
    query = {"user": "cloudgpu-tunnel", "type": key.split()[0], "key": key.split()[1]}
    assert client.get("/internal/tunnels/authorized-keys", query).status_code == 404
    wrong = {"HTTP_X_CLOUDGPU_GATEWAY_SECRET": "x" * 40}
    assert client.get("/internal/tunnels/authorized-keys", query, **wrong).status_code == 404
    ok = {"HTTP_X_CLOUDGPU_GATEWAY_SECRET": SECRET}
    keys = client.get("/internal/tunnels/authorized-keys", query, **ok)
    assert f'permitlisten="127.0.0.1:{tunnel.listen_port}"' in keys.content.decode()

    auth = client.get("/internal/tunnels/edge/auth", HTTP_X_CLOUDGPU_TUNNEL_HOST=host, **ok)
    assert auth.status_code == 204
    assert auth["X-CloudGPU-Tunnel-Port"] == str(tunnel.listen_port)
    unknown = client.get(
        "/internal/tunnels/edge/auth", HTTP_X_CLOUDGPU_TUNNEL_HOST=f"nope-i.{DOMAIN}", **ok
    )
    assert unknown.status_code == 403
    page = client.get(
        "/internal/tunnels/edge/page", HTTP_X_CLOUDGPU_TUNNEL_HOST=f"nope-i.{DOMAIN}", **ok
    )
    assert page.status_code == 404
    # Routable, yet the edge got no answer from the container: 502 naming the states.
    failed = client.get("/internal/tunnels/edge/page", HTTP_X_CLOUDGPU_TUNNEL_HOST=host, **ok)
    assert failed.status_code == 502
    assert "Rental state: <strong>running</strong>" in failed.content.decode()
    assert "nothing in the container answers on port 8080" in failed.content.decode()


def test_the_access_form_sets_a_cookie_for_the_tunnel_host_only_from_its_own_origin(
    gateway: Path, tmp_path: Path
) -> None:
    lease = _running([8080], key=_keygen(tmp_path / "k"), access_protected=True)
    _up(lease)
    host = f"{lease.tunnels.get().public_id}-i.{DOMAIN}"
    headers = {"HTTP_X_CLOUDGPU_GATEWAY_SECRET": SECRET, "HTTP_X_CLOUDGPU_TUNNEL_HOST": host}
    client = Client()
    token = access.issue(lease.pk)
    url = "/internal/tunnels/edge/access"
    assert client.get(url, **headers).status_code == 200
    assert client.post(url, {"token": "cgpa_nope"}, **headers).status_code == 401
    cross = client.post(url, {"token": token}, HTTP_ORIGIN="https://evil.example", **headers)
    assert cross.status_code == 403
    opened = client.post(url, {"token": token}, HTTP_ORIGIN=f"https://{host}", **headers)
    assert opened.status_code == 302
    cookie = opened.cookies[access.COOKIE]
    assert cookie.value == token
    assert cookie["httponly"]
    assert cookie["secure"]  # the URL scheme is https here
    auth = Client().get(
        "/internal/tunnels/edge/auth", HTTP_COOKIE=f"{access.COOKIE}={token}", **headers
    )
    assert auth.status_code == 204


def test_access_tokens_are_redacted_from_logs() -> None:
    token = access.issue("8d3c3b52-5a9c-4c53-a7e6-0d8f0d1e0f3a")
    line = f"GET / Authorization: Bearer {token} cookie={token.replace('_', '%5F')}"
    assert token not in redact(line)
    assert "cgpa_[redacted]" in redact(line)


# --- the gateway's configuration ----------------------------------------------------------------


def test_the_edge_never_cuts_a_response_before_620_s_by_default(tmp_path: Path) -> None:
    options = GatewayOptions(folder=tmp_path, hub_url="http://127.0.0.1:8000")
    assert DEFAULT_TIMEOUT_S >= 620
    nginx = render_nginx_config(options, SECRET)
    for directive in ("proxy_read_timeout", "proxy_send_timeout", "send_timeout"):
        assert f"{directive} {DEFAULT_TIMEOUT_S}s;" in nginx
    assert "proxy_buffering off;" in nginx
    # No query strings in access logs.
    assert "$args" not in nginx
    assert "$request " not in nginx
    sshd = render_sshd_config(options)
    for line in (
        "AllowTcpForwarding remote",
        "PermitOpen none",
        "GatewayPorts no",
        "MaxSessions 0",
    ):
        assert line in sshd.splitlines()
    with pytest.raises(ValueError, match="hub URL"):
        render_nginx_config(GatewayOptions(folder=tmp_path, hub_url="web:8000"), SECRET)
