"""The local trial's tunnel gateway (`make run`): the real one (``python -m hub.tunnels.gateway
run``, OpenSSH's sshd plus nginx from the distribution's packages) on loopback ports, with URLs
``http://<id>-i.localhost:<port>/`` (browsers resolve every ``*.localhost`` to loopback).

As root its sshd serves agents (cloudgpu-tunnel) and renters' SSH (cloudgpu-ssh); as another
user it runs as that user, who is then the agents' login, and renters' SSH is off (an sshd that
is not root logs in only its own user).

``plan`` decides whether it can run here and prepares what the hub must know before it starts
(host key, shared secret, ports); when it cannot, it says why and what to install, and the hub
runs without tunnels.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hub.lib.embedded import SHARED_PGINSTALL_DIR

SSHD = "/usr/sbin/sshd"
# The logins the gateway's sshd serves: agents' remote forwards and renters' local forwards
# (the hub's TUNNEL_GATEWAY_USER / TUNNEL_GATEWAY_RENTER_USER defaults).
LOGIN_USERS = ("cloudgpu-tunnel", "cloudgpu-ssh")
DOMAIN = "localhost"


class GatewayUnavailable(Exception):
    """The demo gateway cannot run on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class DemoGateway:
    folder: Path
    secret_file: Path
    ssh_port: int
    http_port: int
    # Not root: sshd logs in only this user, so agents log in as it and renters' SSH is off.
    own_user: str | None = None

    @property
    def host_keys_file(self) -> Path:
        return self.folder / "ssh_host_ed25519_key.pub"

    def hub_settings(self) -> dict[str, str]:
        """The hub's tunnel settings for this gateway (the secret by file, never by value)."""
        return {
            "TUNNEL_DOMAIN": DOMAIN,
            "TUNNEL_URL_SCHEME": "http",
            "TUNNEL_URL_PORT": str(self.http_port),
            "TUNNEL_GATEWAY_SSH_HOST": "127.0.0.1",
            "TUNNEL_GATEWAY_SSH_PORT": str(self.ssh_port),
            "TUNNEL_GATEWAY_HOST_KEYS_FILE": str(self.host_keys_file),
            "TUNNEL_GATEWAY_SECRET_FILE": str(self.secret_file),
        } | (
            {"TUNNEL_GATEWAY_USER": self.own_user, "TUNNEL_GATEWAY_RENTER_USER": ""}
            if self.own_user
            else {}
        )

    def url_pattern(self) -> str:
        return f"http://<id>-i.{DOMAIN}:{self.http_port}/"

    def argv(self, hub_url: str) -> list[str]:
        return [
            sys.executable,
            *("-m", "hub.tunnels.gateway", "run", "--folder", str(self.folder)),
            *("--hub-url", hub_url),
            *("--ssh-listen", f"127.0.0.1:{self.ssh_port}"),
            *("--http-listen", f"127.0.0.1:{self.http_port}"),
            *("--nginx-workers", "1"),
            *(
                ("--user", self.own_user, "--keys-command-user", self.own_user, "--renter-user", "")
                if self.own_user
                else ()
            ),
        ]


def missing_packages() -> list[str]:
    """The Debian packages the gateway needs that are not installed."""
    wanted = {
        "openssh-server": Path(SSHD).exists(),
        "openssh-client": shutil.which("ssh-keygen") is not None,
        "nginx-light": shutil.which("nginx") is not None,
    }
    return [package for package, present in wanted.items() if not present]


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _folder_problem(folder: Path) -> str | None:
    """Why sshd would refuse a key command in ``folder`` (None: it would not)."""
    # sshd refuses an AuthorizedKeysCommand below a folder anyone but root (or, for a user's
    # own sshd, that user) may write to; as root the key command runs as nobody, who must
    # be able to walk down to it.
    owners = {0, os.geteuid()}
    for parent in [folder, *folder.parents]:
        info = parent.stat()
        if info.st_uid not in owners or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{parent} must be owned by root (or you) and writable by its owner only"
        if os.geteuid() == 0 and not info.st_mode & stat.S_IXOTH:
            return f"{parent} must be searchable by others (o+x): the key command runs as nobody"
    return None


def _private_root() -> Path:
    """Where the gateway's folder goes when the state folder breaks sshd's rules (a clone in
    /root, 0700, or under /tmp, writable by all): root's system folder, as for the embedded
    Postgres; a user's own state folder otherwise."""
    if os.geteuid() == 0:
        return SHARED_PGINSTALL_DIR
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg.startswith("/") else Path.home() / ".local" / "state"
    return base / "cloudgpu"


def gateway_folder(state: Path) -> Path:
    """The gateway's folder: ``<state>/gateway`` where sshd accepts it, else one named for the
    state folder (each trial keeps its own host key) under ``_private_root()``; raises
    GatewayUnavailable when neither qualifies."""
    in_state = state / "gateway"
    if _folder_problem(state) is None:
        return in_state
    root = _private_root()
    try:
        root.mkdir(mode=0o755 if os.geteuid() == 0 else 0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise GatewayUnavailable(f"cannot create {root}: {exc.strerror}") from None
    digest = hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:16]
    folder = root / f"gateway-{digest}"
    problem = _folder_problem(root)
    if problem is not None:
        raise GatewayUnavailable(
            f"{problem} (sshd refuses key commands below it); pass --state in such a folder"
        )
    return folder


def _ensure_login_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
    # useradd leaves the account locked ('!' in /etc/shadow), and sshd without PAM refuses a
    # locked account even for keys; '*' keeps it password-less but usable with keys.
    shadow = Path("/etc/shadow").read_text().splitlines()
    entry = next((line.split(":") for line in shadow if line.startswith(f"{name}:")), None)
    if entry is not None and len(entry) > 1 and entry[1].startswith("!"):
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True)


def _secret_file(state: Path) -> Path:
    path = state / "gateway_secret"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32) + "\n")  # no quotes: nginx's config holds it
    return path


def plan(state: Path, ssh_port: int, http_port: int) -> DemoGateway:
    """Everything the gateway and the hub need, made ready; raises GatewayUnavailable."""
    missing = missing_packages()
    if missing:
        raise GatewayUnavailable(
            f"{', '.join(missing)} not installed (apt install {' '.join(missing)})"
        )
    root = os.geteuid() == 0
    for port in (ssh_port, http_port):
        if not _port_free(port):
            raise GatewayUnavailable(
                f"127.0.0.1:{port} is taken; choose other ports with HUB_GATEWAY_SSH_PORT / "
                "HUB_GATEWAY_HTTP_PORT"
            )
    folder = gateway_folder(state)
    folder.mkdir(mode=0o755, exist_ok=True)
    folder.chmod(0o755)  # the key command's user (nobody) must reach its script
    for name in LOGIN_USERS if root else ():
        try:
            _ensure_login_user(name)
        except (subprocess.CalledProcessError, OSError) as exc:
            raise GatewayUnavailable(f"could not make the login user {name}: {exc}") from None
    key = folder / "ssh_host_ed25519_key"
    if not key.exists():
        # Made here, not by the gateway, because the hub reads the public half at start.
        subprocess.run(
            [
                *("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cloudgpu-gateway"),
                *("-f", str(key)),
            ],
            check=True,
            capture_output=True,
        )
    own_user = None if root else pwd.getpwuid(os.geteuid()).pw_name
    return DemoGateway(folder, _secret_file(state), ssh_port, http_port, own_user)
