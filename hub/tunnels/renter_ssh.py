"""Renters' SSH through the gateway: ``ssh -J`` / ``ssh -L`` to their own running rentals' ports.

The gateway's sshd asks the hub at every login (its AuthorizedKeysCommand). For the renters'
login user the answer is one authorized_keys line allowing ``direct-tcpip`` only to the gateway
loopback ports (``listen_port``) of the key owner's RUNNING leases' declared ports, and nothing
else (``restrict``; the sshd config's Match block refuses -R, sessions, TTYs and agent/X11/
socket forwarding for that user as well). An unknown or deleted key, or an owner with no
running lease, gets no line: no login.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass

from django.conf import settings

from hub.accounts.models import SshKey
from hub.accounts.ssh_keys import note_used
from hub.leases.models import Lease
from hub.lib.ssh_keys import fingerprint
from hub.tunnels import services
from hub.tunnels.models import Tunnel

# Only RUNNING: a starting lease's container may not be the renter's yet in any useful sense,
# and a stopping one is being taken away.
OPEN_STATES = (Lease.State.RUNNING,)
SSH_PORT = 22
# -L binds the renter's own machine; below 1024 that needs root there, so such ports move up.
LOCAL_PORT_OFFSET = 10000


def enabled() -> bool:
    return bool(settings.TUNNEL_GATEWAY_RENTER_USER and services.enabled())


def authorized_keys(key_type: str, key_blob: str) -> str:
    """sshd's answer for the renters' login user and this key: a line or nothing."""
    if not enabled():
        return ""
    try:
        print_ = fingerprint(key_blob)
    except (binascii.Error, ValueError):
        return ""
    key = SshKey.objects.filter(fingerprint=print_).first()
    if key is None or key.key_type != key_type or key.blob != key_blob:
        return ""
    ports = list(
        Tunnel.objects.filter(
            lease__renter_id=key.user_id, lease__state__in=OPEN_STATES, closed_at__isnull=True
        )
        .order_by("listen_port")
        .values_list("listen_port", flat=True)
    )
    if not ports:
        return ""
    note_used(key)
    opens = ",".join(f'permitopen="127.0.0.1:{port}"' for port in ports)
    # restrict: no pty, no agent or X11 forwarding, no rc, no -R (no permitlisten); the forced
    # command ends a shell or exec request at once. The comment names the account, not the
    # renter's own comment (theirs is free text; this line is read by sshd).
    options = f'restrict,port-forwarding,{opens},command="/usr/sbin/nologin"'
    return f"{options} {key.key_type} {key.blob} cloudgpu-renter-{key.user_id}\n"


# --- what the lease page and the API show -------------------------------------------------------


@dataclass(frozen=True)
class Forward:
    port: int  # the container's
    listen_port: int  # on the gateway's loopback
    local_port: int  # suggested on the renter's machine
    command: str  # ssh -N -L ...


@dataclass(frozen=True)
class SshAccess:
    gateway_host: str
    gateway_port: int
    user: str
    host_alias: str
    known_hosts: list[str]  # the gateway's host key(s) as known_hosts lines
    forwards: list[Forward]
    config: str  # a ~/.ssh/config Host block, when port 22 is declared; else ""

    @property
    def other_forwards(self) -> list[Forward]:
        """Every declared port but 22 (which the config block covers): ``ssh -L`` lines."""
        return [f for f in self.forwards if f.port != SSH_PORT]

    @property
    def jump(self) -> str:
        return f"{self.user}@{self.gateway_host}:{self.gateway_port}"


def _known_host(host: str, port: int) -> str:
    return host if port == SSH_PORT else f"[{host}]:{port}"


def lease_access(lease: Lease) -> SshAccess | None:
    """How the renter reaches this lease's ports over SSH, or None while there is no way."""
    if not enabled() or lease.state not in OPEN_STATES:
        return None
    tunnels = [t for t in lease.tunnels.all() if t.closed_at is None]
    if not tunnels:
        return None
    host = settings.TUNNEL_GATEWAY_PUBLIC_SSH_HOST
    port = settings.TUNNEL_GATEWAY_PUBLIC_SSH_PORT
    user = settings.TUNNEL_GATEWAY_RENTER_USER
    alias = f"cloudgpu-{str(lease.pk)[:8]}"
    login = f"-p {port} {user}@{host}" if port != SSH_PORT else f"{user}@{host}"
    forwards = []
    for tunnel in sorted(tunnels, key=lambda t: t.container_port):
        local = tunnel.container_port
        if local < 1024:
            local += LOCAL_PORT_OFFSET
        command = f"ssh -N -L {local}:127.0.0.1:{tunnel.listen_port} {login}"
        forwards.append(Forward(tunnel.container_port, tunnel.listen_port, local, command))
    config = ""
    ssh = next((f for f in forwards if f.port == SSH_PORT), None)
    if ssh is not None:
        # HostKeyAlias: the rental's host key is kept under its own name, not "[127.0.0.1]:port"
        # (ports are reused by later rentals, whose keys differ).
        config = (
            f"Host {alias}\n"
            f"    HostName 127.0.0.1\n"
            f"    Port {ssh.listen_port}\n"
            f"    User root\n"
            f"    ProxyJump {user}@{host}:{port}\n"
            f"    HostKeyAlias {alias}\n"
        )
    known = [f"{_known_host(host, port)} {key}" for key in services.host_keys()]
    return SshAccess(host, port, user, alias, known, forwards, config)
