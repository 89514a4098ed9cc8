"""An agent's registration: its token checked, its host and GPUs upserted, the host online,
and what it should hold (claims, pre-pulls) answered; and the channel forgotten when its socket
closes. Called by the agent socket (consumer.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from hub.agents.stats import pg_offline_after
from hub.catalog.prepull import images_for
from hub.leases.models import Lease
from hub.leases.services import reconcile_claims
from hub.suppliers import liveness, transitions
from hub.suppliers.models import AgentToken, Gpu, Host
from hub.suppliers.services import tell_old_socket
from supplier_agent.protocol import GpuState, Register


class RegistrationRefused(Exception):
    """The agent may not register (e.g. its id belongs to another supplier)."""


@dataclass(frozen=True)
class Registered:
    host_id: int
    desired_claims: tuple[str, ...]
    prepull_images: tuple[str, ...] = ()


def probe_registration(token_id: int, message: Register) -> str:
    """What a registration would answer, without any change: the host id, or "new"."""
    token = AgentToken.objects.get(pk=token_id)
    host = Host.objects.filter(agent_id=message.agent_id).first()
    if host is None:
        return "new"
    if host.owner_id != token.owner_id:
        raise RegistrationRefused("this agent id is registered to another supplier")
    return str(host.pk)


def register_host(token_id: int, message: Register, channel_name: str) -> Registered:
    now = timezone.now()
    with transaction.atomic():
        token = AgentToken.objects.select_related("owner").get(pk=token_id)
        if token.revoked_at is not None or not token.owner.is_active:
            raise RegistrationRefused("this agent token was revoked")
        host = Host.objects.select_for_update(no_key=True).filter(agent_id=message.agent_id).first()
        if host is not None and host.owner_id != token.owner_id:
            raise RegistrationRefused("this agent id is registered to another supplier")
        if host is not None:
            _refuse_takeover(host, token.pk, message.machine_id)
        if host is None:
            if Host.objects.filter(token=token).count() >= settings.MAX_HOSTS_PER_TOKEN:
                raise RegistrationRefused(
                    f"this agent token already holds {settings.MAX_HOSTS_PER_TOKEN} hosts "
                    "(MAX_HOSTS_PER_TOKEN); create another token for more machines"
                )
            host = Host(owner=token.owner, agent_id=message.agent_id, status=Host.Status.OFFLINE)
        host.machine_id = message.machine_id or host.machine_id
        host.token = token
        for field in ("hostname", "os", "arch", "cpu_model", "cpu_count", "ram_bytes"):
            setattr(host, field, getattr(message, field))
        # Measured by newer agents only: an older one's register leaves them unknown, not stale.
        host.disk_free_bytes = message.disk_free_bytes
        host.driver_version = message.driver_version
        host.cuda_version = message.cuda_version
        host.agent_version = message.agent_version
        host.runtime = message.runtime
        host.last_seen_at = now
        host.offline_after = pg_offline_after(now)
        previous_channel = host.channel_name
        host.channel_name = channel_name
        is_new = host.pk is None
        if is_new:
            host.save()
        transitions.set_online(host, "agent registered")
        host.save()
        _upsert_gpus(host, message.gpus, now)
        desired = reconcile_claims(host, message.claims, now)
        # Before the commit that makes the host online: the offline sweep must never see the
        # new status next to the old deadline.
        liveness.sync_client().zadd(
            liveness.liveness_key(), {str(host.pk): time.time() + settings.HOST_OFFLINE_AFTER_S}
        )
    if previous_channel and previous_channel != channel_name:
        # Called from the agent socket's own loop (through database_sync_to_async), where
        # async_to_sync reuses that loop and its Redis pool.
        tell_old_socket(
            previous_channel,
            {"type": "agent.superseded"},
            lambda: async_to_sync(get_channel_layer().send)(
                previous_channel, {"type": "agent.superseded"}
            ),
        )
    return Registered(host_id=host.pk, desired_claims=desired, prepull_images=images_for(host.pk))


def _refuse_takeover(host: Host, token_id: int, machine_id: str) -> None:
    """Only the machine that holds an agent id speaks for it. Another token or machine may take
    it over only once the holder's socket is gone, and another machine only once no rental is
    left on the host: a copied state folder (or a second token of the same supplier) must never
    end the rentals of the machine that really runs them."""
    other_token = host.token_id is not None and host.token_id != token_id
    other_machine = bool(machine_id and host.machine_id and machine_id != host.machine_id)
    if not (other_token or other_machine):
        return
    if _held_by_live_socket(host):
        raise RegistrationRefused(
            "agent id in use on another machine"
            + (" with another token" if other_token and not other_machine else "")
            + ": was the agent's state folder copied? Each machine needs its own state folder "
            "(run `cloudgpu-agent configure` with a fresh --state there)"
        )
    if other_machine and Lease.objects.filter(host=host, state__in=Lease.ACTIVE_STATES).exists():
        raise RegistrationRefused(
            "agent id belongs to another machine, whose rentals are still active on the "
            "hub: was the agent's state folder copied? Give this machine its own state "
            "folder; the agent id moves only once those rentals have ended"
        )


def _held_by_live_socket(host: Host) -> bool:
    if not host.channel_name or host.status != Host.Status.ONLINE:
        return False
    deadline = liveness.deadline_of(host.pk)
    if deadline is not None:
        return deadline > time.time()
    return host.offline_after is not None and host.offline_after > timezone.now()


def _upsert_gpus(host: Host, gpus: tuple[GpuState, ...], now: datetime) -> None:
    existing = {
        gpu.index: gpu for gpu in Gpu.objects.select_for_update(no_key=True).filter(host=host)
    }
    for state in gpus:
        gpu = existing.pop(state.index, None) or _new_gpu(host, state.index)
        gpu.uuid = state.uuid
        gpu.name = state.name
        gpu.present = True
        _apply_telemetry(gpu, state, now)
        gpu.save()
    # GPUs the host no longer reports stay for history but cannot be rented.
    Gpu.objects.filter(pk__in=[gpu.pk for gpu in existing.values()]).update(present=False)


def _new_gpu(host: Host, index: int) -> Gpu:
    """A GPU seen for the first time: listed at the host's default price if its owner set
    one, otherwise unlisted and unpriced until they do (never for rent at $0 by accident)."""
    default = host.default_price_per_hour_micros
    if default is None and host.token_id is not None:
        default = (
            AgentToken.objects.filter(pk=host.token_id)
            .values_list("default_price_per_hour_micros", flat=True)
            .first()
        )
    if default is None:
        return Gpu(host=host, index=index, listed=False, priced=False)
    return Gpu(host=host, index=index, listed=True, priced=True, price_per_hour_micros=default)


def _apply_telemetry(gpu: Gpu, state: GpuState, now: datetime) -> None:
    gpu.memory_total_bytes = state.memory_total_bytes
    gpu.memory_used_bytes = state.memory_used_bytes
    gpu.utilization_pct = state.utilization_pct
    gpu.processes = [
        {"pid": p.pid, "name": p.name, "memory_bytes": p.memory_bytes} for p in state.processes
    ]
    gpu.stats_updated_at = now


def detach_channel(host_id: int, channel_name: str) -> None:
    """The connection closed; forget its channel unless a newer connection already took over."""
    Host.objects.filter(pk=host_id, channel_name=channel_name).update(channel_name="")
