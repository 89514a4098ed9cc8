"""Small builders for hub service tests: people, tokens, registered hosts, leases.

They go through the services wherever one exists, so a test starts from rows the hub itself
would have written.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from hub.accounts.models import User
from hub.agents import heartbeat_batch, registration, sweep
from hub.leases import services as lease_services
from hub.leases.models import Command, Lease
from hub.suppliers import liveness
from hub.suppliers import services as supplier_services
from hub.suppliers.models import AgentToken, Host
from supplier_agent.protocol import Ack, ClaimState, GpuProcess, GpuState, Heartbeat, Register

_serial = itertools.count(1)

GIB = 1 << 30
TEST_IMAGE = "cloudgpu-test/busybox:latest"


def make_user(prefix: str = "user", **fields: Any) -> User:
    # No service creates ordinary accounts yet; Django's manager is the documented way.
    return User.objects.create_user(
        username=f"{prefix}-{next(_serial)}-{uuid.uuid4().hex[:6]}", password=None, **fields
    )


def make_token(
    owner: User | None = None, name: str = "test", default_price_per_hour_micros: int | None = 0
) -> tuple[AgentToken, str]:
    """An agent token; by default its hosts' new GPUs are for rent at $0 (pass None for the
    real default: unlisted until priced)."""
    return supplier_services.create_agent_token(
        owner or make_user("supplier"),
        name,
        default_price_per_hour_micros=default_price_per_hour_micros,
    )


def gpu_state(
    index: int,
    *,
    utilization_pct: int = 0,
    memory_used_bytes: int = 0,
    memory_total_bytes: int = 24 * GIB,
    pids: Iterable[int] = (),
    gpu_uuid: str | None = None,
) -> GpuState:
    return GpuState(
        index=index,
        uuid=gpu_uuid or f"GPU-{uuid.uuid4()}",
        name="NVIDIA GeForce RTX 4090",
        memory_total_bytes=memory_total_bytes,
        memory_used_bytes=memory_used_bytes,
        utilization_pct=utilization_pct,
        processes=tuple(GpuProcess(pid=pid, name="python", memory_bytes=GIB) for pid in pids),
    )


def claim_of(lease: Lease, gpu_indices: Iterable[int] = (0,)) -> ClaimState:
    return ClaimState(lease_id=str(lease.id), gpu_indices=tuple(gpu_indices), epoch=lease.epoch)


def register_message(
    agent_id: str | None = None,
    *,
    gpus: Iterable[int | GpuState] = (0,),
    claims: Iterable[ClaimState] = (),
    hostname: str = "rig-1",
) -> Register:
    return Register(
        agent_id=agent_id or str(uuid.uuid4()),
        hostname=hostname,
        os="Debian GNU/Linux 13",
        arch="x86_64",
        cpu_model="AMD EPYC 7543",
        cpu_count=32,
        ram_bytes=128 * GIB,
        agent_version="1.0.0",
        runtime="docker",
        gpus=tuple(g if isinstance(g, GpuState) else gpu_state(g) for g in gpus),
        claims=tuple(claims),
    )


def register_host(
    token: AgentToken | None = None,
    *,
    agent_id: str | None = None,
    gpus: Iterable[int | GpuState] = (0,),
    claims: Iterable[ClaimState] = (),
    channel_name: str = "",
) -> Host:
    token = token or make_token()[0]
    message = register_message(agent_id, gpus=gpus, claims=claims)
    registered = registration.register_host(token.pk, message, channel_name)
    return Host.objects.get(pk=registered.host_id)


@contextmanager
def private_redis_keys() -> Iterator[str]:
    """The hub's own Redis keys under a prefix of this test's own (REDIS_KEY_PREFIX), deleted
    after. The real keys are shared by every hub on that Redis, and test databases number hosts
    from 1 again: a test's host 2 would read (and the sweep would forget) a live hub's host 2.
    Nested uses share the outer prefix."""
    if getattr(settings, "REDIS_KEY_PREFIX", "").startswith("cloudgpu-test-"):
        yield settings.REDIS_KEY_PREFIX
        return
    prefix = f"cloudgpu-test-{uuid.uuid4().hex}"
    with override_settings(REDIS_KEY_PREFIX=prefix):
        try:
            yield prefix
        finally:
            client = liveness.sync_client()
            stale = list(client.scan_iter(match=f"{prefix}:*", count=1000))
            if stale:
                client.delete(*stale)


@contextmanager
def private_liveness_set() -> Iterator[str]:
    """hub.suppliers.liveness on a sorted set (and sweep marks) of this test's own, as if the
    sweep had been running without a gap: tests of the hold say so themselves."""
    with private_redis_keys():
        mark_sweep_continuous()
        yield liveness.liveness_key()


def mark_sweep_continuous() -> None:
    client = liveness.sync_client()
    run_id = client.info("server")["run_id"]
    client.set(liveness.sweep_mark_key(), f"{run_id} {time.time()!r}")
    client.delete(liveness.sweep_hold_key())


@contextmanager
def private_pending_hash() -> Iterator[str]:
    """hub.agents.heartbeat_batch on a pending-telemetry hash of this test's own."""
    with private_redis_keys():
        yield heartbeat_batch.pending_key()


def set_liveness_deadline(host_id: int, deadline: datetime) -> None:
    # The agent socket writes this through heartbeat_batch; the same ZADD, synchronously.
    liveness.sync_client().zadd(liveness.liveness_key(), {str(host_id): deadline.timestamp()})


def take_offline(host: Host) -> None:
    """The offline sweep, with the host's Redis deadline just past; the sweep forgets it."""
    now = timezone.now()
    mark_sweep_continuous()
    try:
        set_liveness_deadline(host.pk, now - timedelta(seconds=1))
        assert host.pk in sweep.mark_overdue_hosts_offline(now=now)
    finally:
        liveness.forget(host.pk)
    host.refresh_from_db()


def heartbeat(
    gpus: Iterable[int | GpuState] = (0,), claims: Iterable[ClaimState] = ()
) -> Heartbeat:
    return Heartbeat(
        gpus=tuple(g if isinstance(g, GpuState) else gpu_state(g) for g in gpus),
        claims=tuple(claims),
    )


def lease_spec(**overrides: Any) -> lease_services.LeaseSpec:
    fields: dict[str, Any] = {
        "image": TEST_IMAGE,
        "ports": [8080],
        "env": {"GREETING": "hello"},
        "command": ["httpd", "-f", "-p", "8080"],
    }
    fields.update(overrides)
    return lease_services.LeaseSpec(**fields)


def start_lease(
    host: Host, gpu_indices: list[int] | None = None, renter: User | None = None, **spec: Any
) -> Lease:
    return lease_services.start_lease(
        renter or make_user("renter"), host, gpu_indices or [0], lease_spec(**spec)
    )


def command_of(lease: Lease, kind: str) -> Command:
    """The lease's newest command of one kind."""
    return Command.objects.filter(lease=lease, kind=kind).latest("created_at")


def ack(
    command: Command,
    ok: bool = True,
    result: dict[str, Any] | None = None,
    error: str | None = None,
    now: datetime | None = None,
) -> bool:
    return lease_services.record_ack(
        command.host_id,
        Ack(command_id=str(command.id), ok=ok, result=result or {}, error=error),
        now,
    )


def run_lease(host: Host, gpu_indices: list[int] | None = None, **spec: Any) -> Lease:
    """A lease taken through reserve and docker_run to running, as an agent would answer."""
    lease = start_lease(host, gpu_indices, **spec)
    assert ack(command_of(lease, Command.Kind.RESERVE), result={"gpu_indices": [0]})
    assert ack(
        command_of(lease, Command.Kind.DOCKER_RUN),
        result={"container_id": "c0ffee", "ports": {"8080": 41000}},
    )
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING
    return lease


def run_lease_of(renter: User, host: Host, now: datetime, index: int = 0) -> Lease:
    """A lease of ``renter`` on GPU ``index``, answered to running at ``now`` (billing counts
    from there)."""
    lease = lease_services.start_lease(renter, host, [index], lease_spec())
    assert ack(command_of(lease, Command.Kind.RESERVE), now=now)
    assert ack(command_of(lease, Command.Kind.DOCKER_RUN), result={"container_id": "c1"}, now=now)
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING
    return lease
