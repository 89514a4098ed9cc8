"""The real tunnel gateway (``python -m hub.tunnels.gateway run``: sshd + nginx configured to
ask the hub) on free loopback ports, for end-to-end tunnel tests. Needs root, like sshd."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from hub.lib.ports import free_port, wait_for_port
from hub.tunnels.gateway_config import TIMEOUT_FLOOR_S
from tests.support.processes import hub_env, python_module, running
from tests.support.sshd import RENTER_USER, ensure_tunnel_user, require_sshd

DOMAIN = "tunnels.test"


def require_gateway() -> None:
    require_sshd()
    if shutil.which("nginx") is None:
        import pytest

        pytest.skip("nginx is not installed (apt install nginx-light)")
    ensure_tunnel_user()
    ensure_tunnel_user(RENTER_USER)


@dataclass
class Gateway:
    folder: Path
    secret: str
    ssh_port: int
    http_port: int
    log: Path  # the gateway's own output (sshd's log among it)
    access_log: Path  # the edge's access log, copied here when the gateway stops

    @property
    def host_keys_file(self) -> Path:
        return self.folder / "ssh_host_ed25519_key.pub"

    def hub_settings(self) -> dict[str, str]:
        """What the hub's processes need to hand out tunnels through this gateway."""
        return {
            "TUNNEL_DOMAIN": DOMAIN,
            "TUNNEL_URL_SCHEME": "http",
            "TUNNEL_GATEWAY_SSH_HOST": "127.0.0.1",
            "TUNNEL_GATEWAY_SSH_PORT": str(self.ssh_port),
            "TUNNEL_GATEWAY_HOST_KEYS_FILE": str(self.host_keys_file),
            "TUNNEL_GATEWAY_SECRET": self.secret,
        }

    def host(self, public_id: str) -> str:
        return f"{public_id}-i.{DOMAIN}"

    def get(self, public_id: str, path: str = "/", **kwargs: object) -> httpx.Response:
        """A request to the edge as a browser would send it to the tunnel's URL."""
        headers = {"Host": self.host(public_id), **kwargs.pop("headers", {})}  # type: ignore[dict-item]
        return httpx.get(
            f"http://127.0.0.1:{self.http_port}{path}",
            headers=headers,
            timeout=kwargs.pop("timeout", 30),  # type: ignore[arg-type]
            **kwargs,  # type: ignore[arg-type]
        )


@contextmanager
def planned_gateway(log_dir: Path) -> Iterator[Gateway]:
    """Ports, folder and secret, chosen before the hub starts (the hub must know them)."""
    require_gateway()
    parent = Path(tempfile.mkdtemp(prefix="cloudgpu-gw-", dir="/run"))
    parent.chmod(0o755)  # sshd runs the key command as nobody, below this folder
    try:
        yield Gateway(
            folder=parent / "gateway",
            secret=secrets.token_urlsafe(32),
            ssh_port=free_port(),
            http_port=free_port(),
            log=log_dir / "gateway.log",
            access_log=log_dir / "edge-access.log",
        )
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@contextmanager
def running_gateway(
    gateway: Gateway, hub_url: str, *, timeout_s: int = 900, renter_max_connection_s: int = 3300
) -> Iterator[Gateway]:
    argv = python_module(
        "hub.tunnels.gateway",
        "run",
        "--folder",
        str(gateway.folder),
        "--hub-url",
        hub_url,
        "--ssh-listen",
        f"127.0.0.1:{gateway.ssh_port}",
        "--http-listen",
        f"127.0.0.1:{gateway.http_port}",
        "--timeout",
        str(timeout_s),
        "--nginx-workers",
        "1",
        "--renter-max-connection-s",
        str(renter_max_connection_s),
        # Tests see the edge cut quiet responses after seconds, not the production 620+.
        *(("--allow-short-timeout",) if timeout_s < TIMEOUT_FLOOR_S else ()),
    )
    env = hub_env(TUNNEL_GATEWAY_SECRET=gateway.secret)
    try:
        with running(argv, env=env, log=gateway.log):
            for port in (gateway.ssh_port, gateway.http_port):
                assert wait_for_port(port, timeout_s=30), gateway.log.read_text()
            yield gateway
    finally:
        with contextlib.suppress(FileNotFoundError):
            shutil.copyfile(gateway.folder / "logs" / "access.log", gateway.access_log)
