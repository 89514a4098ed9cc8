"""Tunnel services: allocation with the lease, the agent's key and states, and the answers the
gateway's sshd (which key may listen where) and edge proxy (which port a host name maps to) get.
"""

from __future__ import annotations

import binascii
import logging
import random
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from hub.leases.models import Lease
from hub.lib.ssh_keys import fingerprint
from hub.tunnels import access
from hub.tunnels.models import Tunnel, TunnelKey
from supplier_agent.protocol import ProtocolError, TunnelState, validate_public_key

log = logging.getLogger(__name__)

# The lease states in which a tunnel is routed and its key may log in.
LIVE_STATES = (Lease.State.STARTING, Lease.State.RUNNING)
_PUBLIC_ID_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no l/1/o/0: read aloud safely
_PUBLIC_ID_LENGTH = 12  # 60 bits: not guessable, short enough for a DNS label
_ALLOCATION_TRIES = 20


class TunnelError(Exception):
    """A tunnel cannot be allocated; the message is fit to show the renter."""


# --- configuration --------------------------------------------------------------------------


def enabled() -> bool:
    return bool(settings.TUNNEL_DOMAIN and settings.TUNNEL_GATEWAY_SSH_HOST and host_keys())


def host_keys() -> tuple[str, ...]:
    path = settings.TUNNEL_GATEWAY_HOST_KEYS_FILE
    if not path:
        return ()
    try:
        stat = Path(path).stat()
    except OSError:
        log.warning("TUNNEL_GATEWAY_HOST_KEYS_FILE=%s cannot be read; tunnels are off", path)
        return ()
    return _read_host_keys(path, stat.st_mtime_ns)


@lru_cache(maxsize=4)
def _read_host_keys(path: str, _mtime_ns: int) -> tuple[str, ...]:
    keys = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            keys.append(validate_public_key(line, "gateway host key"))
        except ProtocolError:
            log.warning("ignoring a line of %s that is not an OpenSSH public key", path)
    return tuple(keys)


def public_url(tunnel: Tunnel) -> str:
    port = f":{settings.TUNNEL_URL_PORT}" if settings.TUNNEL_URL_PORT else ""
    return f"{settings.TUNNEL_URL_SCHEME}://{tunnel.public_id}-i.{settings.TUNNEL_DOMAIN}{port}/"


# --- allocation -----------------------------------------------------------------------------


def _new_public_id() -> str:
    return "".join(secrets.choice(_PUBLIC_ID_ALPHABET) for _ in range(_PUBLIC_ID_LENGTH))


def _free_listen_port(now: datetime) -> int:
    low, high = settings.TUNNEL_LISTEN_PORT_MIN, settings.TUNNEL_LISTEN_PORT_MAX
    quarantine = now - timedelta(seconds=settings.TUNNEL_PORT_QUARANTINE_S)
    for _ in range(_ALLOCATION_TRIES):
        port = random.randint(low, high)  # noqa: S311 - spreading, not secrecy
        # Open, or closed within the quarantine: one query.
        held = Q(closed_at__isnull=True) | Q(closed_at__gt=quarantine)
        if not Tunnel.objects.filter(held, listen_port=port).exists():
            return port
    raise TunnelError("the tunnel gateway has no free port; try again shortly")


def allocate(lease: Lease) -> list[Tunnel]:
    """One tunnel per declared port, inside the caller's transaction. A lost race for a port
    (the partial unique index) is retried under a savepoint."""
    now = timezone.now()
    tunnels = []
    for port in lease.ports:
        for _ in range(_ALLOCATION_TRIES):
            tunnel = Tunnel(
                lease=lease,
                public_id=_new_public_id(),
                container_port=int(port),
                listen_port=_free_listen_port(now),
            )
            try:
                with transaction.atomic():
                    tunnel.save()
            except IntegrityError:
                continue
            tunnels.append(tunnel)
            break
        else:
            raise TunnelError("the tunnel gateway has no free port; try again shortly")
    return tunnels


def docker_run_spec(lease: Lease) -> dict[str, Any] | None:
    """The ``tunnel`` field of the lease's docker_run, or None when it has no tunnels."""
    keys = host_keys()
    if not keys:
        return None  # tunnels off: no query (a rent checks its docker_run in its transaction)
    tunnels = list(lease.tunnels.filter(closed_at__isnull=True))
    if not tunnels:
        return None
    return {
        "host": settings.TUNNEL_GATEWAY_SSH_HOST,
        "port": settings.TUNNEL_GATEWAY_SSH_PORT,
        "user": settings.TUNNEL_GATEWAY_USER,
        "host_keys": list(keys),
        "forwards": [{"port": t.container_port, "listen_port": t.listen_port} for t in tunnels],
    }


# --- the agent's side -----------------------------------------------------------------------


def register_key(lease: Lease, public_key: Any) -> str | None:
    """Keep the lease's key from its docker_run ack. Returns a warning for the lease, or None."""
    if not lease.tunnels.exists():
        return None
    if public_key is None:
        return "the agent sent no tunnel key (is it older than the hub?); no URL for this lease"
    try:
        key = validate_public_key(public_key, "tunnel_public_key")
        key_type, blob = key.split()[:2]
        print_ = fingerprint(blob)
    except (ProtocolError, binascii.Error, ValueError) as exc:
        return f"the agent sent an unusable tunnel key: {exc}"
    try:
        with transaction.atomic():
            TunnelKey.objects.update_or_create(
                lease=lease, defaults={"public_key": f"{key_type} {blob}", "fingerprint": print_}
            )
    except IntegrityError:
        # The same key for two leases: never trust it for either.
        log.warning("lease %s sent a tunnel key another lease uses; ignored", lease.pk)
        return "the agent reused another lease's tunnel key; no URL for this lease"
    return None


def apply_ack_states(lease: Lease, states: Any, now: datetime) -> None:
    """The tunnel states a docker_run ack carries ({"8080": "up"}): the lease turns running
    with its URLs' true state, not a moment before the agent's tunnel_state frames arrive."""
    if not isinstance(states, dict):
        return
    for port, state in states.items():
        if not (isinstance(port, str) and port.isdigit() and len(port) <= 5):
            continue
        if state not in (Tunnel.State.UP, Tunnel.State.DOWN):
            continue
        lease.tunnels.filter(container_port=int(port), closed_at__isnull=True).exclude(
            state=state
        ).update(state=state, state_changed_at=now)


def record_state(host_id: int, message: TunnelState) -> None:
    Tunnel.objects.filter(
        lease_id=message.lease_id,
        lease__host_id=host_id,
        container_port=message.port,
        closed_at__isnull=True,
    ).update(state=message.state, detail=message.detail[:512], state_changed_at=timezone.now())


def close(lease: Lease, now: datetime) -> None:
    """The lease is over: its ids answer 404 and its key logs in nowhere."""
    lease.tunnels.filter(closed_at__isnull=True).update(
        state=Tunnel.State.CLOSED, closed_at=now, state_changed_at=now
    )
    TunnelKey.objects.filter(lease=lease).delete()


# --- the gateway's questions ----------------------------------------------------------------


def authorized_keys(user: str, key_type: str, key_blob: str) -> str:
    """What sshd's AuthorizedKeysCommand prints: nothing for an unknown or finished lease's key,
    else one line that allows exactly this lease's forwards and nothing else."""
    if user != settings.TUNNEL_GATEWAY_USER:
        return ""
    try:
        print_ = fingerprint(key_blob)
    except (binascii.Error, ValueError):
        return ""
    record = (
        TunnelKey.objects.select_related("lease")
        .filter(fingerprint=print_, lease__state__in=LIVE_STATES)
        .first()
    )
    if record is None or record.public_key != f"{key_type} {key_blob}":
        return ""
    ports = sorted(
        record.lease.tunnels.filter(closed_at__isnull=True).values_list("listen_port", flat=True)
    )
    if not ports:
        return ""
    listens = ",".join(f'permitlisten="127.0.0.1:{port}"' for port in ports)
    # restrict: no pty, no agent or X11 forwarding, no rc; the forced command makes a shell or
    # exec request end at once (sshd's AllowTcpForwarding=remote already refuses -L).
    options = f'restrict,port-forwarding,{listens},command="/usr/sbin/nologin"'
    return f"{options} {record.public_key} cloudgpu-lease-{record.lease_id}\n"


def parse_public_id(host: str) -> str | None:
    """``<id>-i.<domain>[:port]`` -> id; anything else -> None."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    name = name.strip().lower().rstrip(".")
    suffix = f"-i.{settings.TUNNEL_DOMAIN}"
    if not settings.TUNNEL_DOMAIN or not name.endswith(suffix):
        return None
    public_id = name[: -len(suffix)]
    if not public_id or len(public_id) > 32 or not public_id.isalnum():
        return None
    return public_id


@dataclass(frozen=True)
class Route:
    """The edge's answer for one request: a port to proxy to, or the page to show instead."""

    status: int  # 200: proxy to listen_port; 404, 401 or 502: show the page
    tunnel: Tunnel | None = None
    lease_state: str = ""

    @property
    def listen_port(self) -> int | None:
        return self.tunnel.listen_port if self.status == 200 and self.tunnel else None


def route(host: str, tokens: list[str]) -> Route:
    public_id = parse_public_id(host)
    if public_id is None:
        return Route(404)
    tunnel = (
        Tunnel.objects.select_related("lease")
        .filter(public_id=public_id, closed_at__isnull=True)
        .first()
    )
    if tunnel is None:
        return Route(404)
    lease = tunnel.lease
    if lease.access_protected and not any(access.grants(lease.pk, t) for t in tokens):
        return Route(401, tunnel, lease.state)
    if lease.state not in LIVE_STATES or tunnel.state != Tunnel.State.UP:
        return Route(502, tunnel, lease.state)
    return Route(200, tunnel, lease.state)
