"""The commands the hub sends to agents (reserve, docker_run, release), built as the protocol's
own messages from a lease.

Every command goes through ``payload``, which runs the agent's own checks on it
(``protocol.checked_body``: the frame size and the message's ``from_dict``, once, without a
JSON round trip) before the outbox row is written: a command the agent would refuse (a 17th
port, a volume name it does not know) fails here, in the transaction that would have queued
it, with the protocol's reason, instead of as an ``error`` reply minutes later on the host.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from hub.billing import services as billing
from hub.leases.models import Lease
from hub.lib.versions import is_older
from hub.tunnels import services as tunnels
from supplier_agent.protocol import (
    HUB_TO_AGENT,
    CacheVolume,
    DockerRun,
    ProtocolError,
    Release,
    RenterVolume,
    Reserve,
    TunnelForward,
    TunnelSpec,
    checked_body,
)
from supplier_agent.protocol import Command as CommandMessage


class InvalidCommand(ProtocolError):
    """The hub built a command the agent's parser refuses; ``str()`` says which command,
    ``reason`` the protocol's words for the field at fault."""

    def __init__(self, message: CommandMessage, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"{message.TYPE} for lease {message.lease_id} would be refused by the agent: {reason}"
        )


def _new_id() -> str:
    return str(uuid.uuid4())


def reserve(lease: Lease, gpus: str) -> Reserve:
    """Claim ``gpus`` (``"0,1"``) on the lease's host."""
    return Reserve(command_id=_new_id(), lease_id=str(lease.id), epoch=lease.epoch, gpus=gpus)


def release(lease: Lease, reason: str) -> Release:
    return Release(command_id=_new_id(), lease_id=str(lease.id), epoch=lease.epoch, reason=reason)


def docker_run(lease: Lease, paid_until: str | None) -> DockerRun:
    """Start the lease's container. ``paid_until``: see ``paid_until`` below (None: no limit)."""
    cache = lease.cache_volume
    tunnel = tunnels.docker_run_spec(lease)
    return DockerRun(
        command_id=_new_id(),
        lease_id=str(lease.id),
        epoch=lease.epoch,
        image=lease.image,
        ports=tuple(lease.ports),
        env=dict(lease.env),
        entrypoint=_optional_tuple(lease.entrypoint),
        command=_optional_tuple(lease.command),
        # The column is blank for "the image's own user"; on the wire that is no field at all.
        user=lease.user or None,
        cache_volume=(
            CacheVolume(name=cache["name"], path=cache["path"]) if cache is not None else None
        ),
        warmup=_optional_tuple(lease.warmup),
        paid_until=paid_until,
        tunnel=_tunnel_spec(tunnel) if tunnel is not None else None,
        volumes=tuple(
            RenterVolume(name=v["name"], path=v["path"], size_bytes=v.get("size_bytes"))
            for v in lease.volumes or ()
        ),
        disk_allowance_bytes=_disk_allowance(lease),
    )


# The first agent that enforces a disk allowance (disk_guard.py). Older agents refuse unknown
# fields, even as null: they get runs without it (and bound nothing) until upgraded.
DISK_ALLOWANCE_SINCE = "0.2.0"


def _disk_allowance(lease: Lease) -> int | None:
    if lease.disk_allowance_bytes is None:
        return None
    if is_older(lease.host.agent_version or "0", DISK_ALLOWANCE_SINCE):
        return None
    return lease.disk_allowance_bytes


def _optional_tuple(value: list[str] | None) -> tuple[str, ...] | None:
    # None (not given) and [] (given, empty) differ: an empty command overrides the image's.
    return None if value is None else tuple(value)


def _tunnel_spec(spec: dict[str, Any]) -> TunnelSpec:
    return TunnelSpec(
        host=spec["host"],
        port=spec["port"],
        user=spec["user"],
        host_keys=tuple(spec["host_keys"]),
        forwards=tuple(
            TunnelForward(port=forward["port"], listen_port=forward["listen_port"])
            for forward in spec["forwards"]
        ),
    )


# The agent's dead-man switch looks this far ahead at most: a longer outage of the hub is
# better met by the host-lost path than by a guess made weeks before.
PAID_UNTIL_HORIZON = timedelta(days=30)


def paid_until(lease: Lease) -> str | None:
    """How long the renter's balance carries all their rentals from now: the agent releases the
    lease itself after this if the hub is unreachable then (it cannot be billed meanwhile).
    Free leases have no such limit."""
    if lease.price_per_hour_micros <= 0:
        return None
    burn = max(billing.committed_burn_per_hour(lease.renter_id), lease.price_per_hour_micros)
    balance = max(0, billing.balance_micros(lease.renter))
    carried = min(timedelta(seconds=balance * 3600 // burn), PAID_UNTIL_HORIZON)
    until: datetime = timezone.now() + carried
    return until.isoformat()


def payload(message: CommandMessage) -> dict[str, Any]:
    """The outbox row's payload: the frame the agent will get, as a dict, once the agent's own
    parser has taken it. Raises ``InvalidCommand`` otherwise."""
    try:
        return checked_body(message, allowed=HUB_TO_AGENT)
    except ProtocolError as exc:
        raise InvalidCommand(message, str(exc)) from None
