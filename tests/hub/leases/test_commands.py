"""The hub's commands are the protocol's own messages: every payload is one the agent's
``parse_message`` takes and that encodes back to itself, and a command it would refuse fails
at the hub before a row is written."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_django.fixtures import SettingsWrapper

from hub.accounts.models import User
from hub.billing import services as billing
from hub.leases import commands, services
from hub.leases.commands import DISK_ALLOWANCE_SINCE
from hub.leases.models import Command, Lease, LeaseGpu
from hub.suppliers.models import Gpu, Host
from hub.volumes import services as volumes
from supplier_agent.protocol import (
    HUB_TO_AGENT,
    CacheVolume,
    DockerRun,
    Message,
    Release,
    RenterVolume,
    Reserve,
    encode,
    parse_message,
)
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

Kind = Command.Kind
# What the validators check of a gateway host key is its shape; no sshd reads this one.
GATEWAY_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHVic2lkZWNvbW1hbmR0ZXN0a2V5Zm9yaHVi"
VOLUME = "vol-" + "a" * 40


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def host() -> Host:
    return f.register_host(gpus=[0, 1])


@pytest.fixture
def reserving(host: Host) -> Lease:
    return f.start_lease(host)


@pytest.fixture
def gateway(settings: SettingsWrapper, tmp_path: Path) -> None:
    keys = tmp_path / "gateway_host_keys"
    keys.write_text(GATEWAY_KEY + "\n")
    settings.TUNNEL_DOMAIN = "tunnels.test"
    settings.TUNNEL_GATEWAY_SSH_HOST = "gw.example.net"
    settings.TUNNEL_GATEWAY_SSH_PORT = 2222
    settings.TUNNEL_GATEWAY_HOST_KEYS_FILE = str(keys)


def _agent_reads(payload: dict[str, Any]) -> Message:
    """The payload as the agent gets it, parsed; it must encode back to the same payload."""
    message = parse_message(json.dumps(payload), allowed=HUB_TO_AGENT)
    assert json.loads(encode(message)) == payload
    return message


def _docker_run(lease: Lease) -> DockerRun:
    message = _agent_reads(f.command_of(lease, Kind.DOCKER_RUN).payload)
    assert isinstance(message, DockerRun)
    return message


# --- payloads the agent takes ---------------------------------------------------------------------


def test_an_agent_that_enforces_allowances_gets_the_leases_in_its_runs(host: Host) -> None:
    """Issue 33 item 1: from agent 0.2.0 on, every run says how much the lease may write."""
    host.agent_version = DISK_ALLOWANCE_SINCE
    host.save(update_fields=["agent_version"])
    lease = f.start_lease(host, command=None)
    assert f.ack(f.command_of(lease, Kind.RESERVE))
    payload = f.command_of(lease, Kind.DOCKER_RUN).payload
    assert payload["disk_allowance_bytes"] == lease.disk_allowance_bytes > 0


def test_reserve_and_release_payloads_parse_and_round_trip(reserving: Lease) -> None:
    command = f.command_of(reserving, Kind.RESERVE)
    reserve = _agent_reads(command.payload)
    assert reserve == Reserve(
        command_id=str(command.id), lease_id=str(reserving.id), epoch=reserving.epoch, gpus="0"
    )

    services.release_lease(reserving.pk)
    command = f.command_of(reserving, Kind.RELEASE)
    assert _agent_reads(command.payload) == Release(
        command_id=str(command.id),
        lease_id=str(reserving.id),
        epoch=reserving.epoch,
        reason=Lease.EndReason.RENTER_STOP,
    )


def test_a_plain_docker_run_carries_exactly_the_fields_it_always_did(host: Host) -> None:
    # Agents refuse unknown fields, even as null: an older agent must still take a plain run.
    host.agent_version = "0.1.0"  # before disk allowances
    host.save(update_fields=["agent_version"])
    lease = f.start_lease(host, command=None)
    assert f.ack(f.command_of(lease, Kind.RESERVE))
    payload = f.command_of(lease, Kind.DOCKER_RUN).payload
    assert set(payload) == {"type", "v", "command_id", "lease_id", "epoch", "image", "ports", "env"}
    run = _docker_run(lease)
    assert (run.image, run.ports, run.env) == (f.TEST_IMAGE, (8080,), {"GREETING": "hello"})


def test_a_docker_run_with_every_optional_field_parses_and_round_trips(
    gateway: None, admin_user: User
) -> None:
    host = f.register_host(gpus=[0])
    Gpu.objects.filter(host=host).update(price_per_hour_micros=1_000_000)
    renter = f.make_user("renter")
    billing.adjust(renter, 10_000_000, "test top-up", admin_user)
    volume = volumes.create_volume(renter, host, "models", 10)
    mounts = volumes.mounts_for_lease(renter, host, [(volume.pk, "/data")])
    spec = f.lease_spec(
        ports=[8080, 8888],
        entrypoint=["/bin/sh", "-c"],
        command=["exec httpd -f"],
        user="1000:1000",
        cache_volume={"name": "hf", "path": "/root/.cache"},
        warmup=["python", "-c", "import torch"],
        volumes=volumes.wire_mounts(mounts),
    )
    lease = services.start_lease(renter, host, [0], spec)
    assert f.ack(f.command_of(lease, Kind.RESERVE))

    run = _docker_run(lease)
    assert run.entrypoint == ("/bin/sh", "-c")
    assert run.command == ("exec httpd -f",)
    assert run.user == "1000:1000"
    assert run.cache_volume == CacheVolume(name=lease.cache_volume["name"], path="/root/.cache")
    assert run.warmup == ("python", "-c", "import torch")
    assert run.volumes == (RenterVolume(volume.wire_name, "/data", volume.size_cap_bytes),)
    assert run.paid_until is not None
    assert run.tunnel is not None
    assert run.tunnel.host_keys == (GATEWAY_KEY,)
    assert {fw.port for fw in run.tunnel.forwards} == {8080, 8888}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("command", []),  # given and empty: overrides the image's CMD, unlike None
        ("entrypoint", ["/entry"]),
        ("user", "nobody"),
        ("warmup", ["true"]),
        ("cache_volume", {"name": "renter-" + "b" * 40, "path": "/cache"}),
        ("volumes", [{"name": VOLUME, "path": "/data", "size_bytes": None}]),
        ("volumes", [{"name": VOLUME, "path": "/data", "size_bytes": 2**30}]),
    ],
)
def test_each_optional_field_alone_reaches_the_agent(
    reserving: Lease, field: str, value: Any
) -> None:
    setattr(reserving, field, value)
    payload = commands.payload(commands.docker_run(reserving, paid_until=None))
    assert payload[field] == value
    _agent_reads(payload)


def test_paid_until_alone_reaches_the_agent(reserving: Lease) -> None:
    payload = commands.payload(commands.docker_run(reserving, "2030-01-01T00:00:00+00:00"))
    run = _agent_reads(payload)
    assert run.paid_until == "2030-01-01T00:00:00+00:00"  # type: ignore[attr-defined]


# --- values the protocol forbids fail at the hub ------------------------------------------------


def test_a_17th_port_is_refused_at_rent_time_before_any_row_is_written(host: Host) -> None:
    with pytest.raises(services.LeaseError, match=r"docker_run\.ports has more than 16 items"):
        f.start_lease(host, ports=list(range(8000, 8017)))
    assert not Lease.objects.exists()
    assert not Command.objects.exists()
    assert not LeaseGpu.objects.exists()


def test_a_forbidden_env_variable_is_refused_at_rent_time(host: Host) -> None:
    with pytest.raises(services.LeaseError, match="LD_PRELOAD may not be set"):
        f.start_lease(host, env={"LD_PRELOAD": "/evil.so"})
    assert not Lease.objects.exists()


def test_a_bad_volume_name_fails_the_docker_run_before_its_row(reserving: Lease) -> None:
    # A column changed behind the hub's back (rent-time checks passed): the reserve's ack that
    # would queue the docker_run raises, and its transaction leaves nothing behind.
    Lease.objects.filter(pk=reserving.pk).update(
        volumes=[{"name": "vol-NOT-HEX", "path": "/data", "size_bytes": None}]
    )
    with pytest.raises(commands.InvalidCommand, match=r"docker_run\.volumes\[0\]\.name") as caught:
        f.ack(f.command_of(reserving, Kind.RESERVE))
    assert str(caught.value).startswith(f"docker_run for lease {reserving.id} ")
    assert not reserving.commands.filter(kind=Kind.DOCKER_RUN).exists()
    reserving.refresh_from_db()
    assert reserving.state == Lease.State.RESERVING
    assert f.command_of(reserving, Kind.RESERVE).state == Command.State.QUEUED


@pytest.mark.parametrize(
    "build",
    [
        lambda lease: commands.reserve(lease, "0,0"),
        lambda lease: commands.reserve(lease, "64"),
        lambda lease: commands.release(lease, "x" * 65),
    ],
    ids=["gpu-twice", "gpu-index-64", "long-reason"],
)
def test_a_command_the_agent_would_refuse_writes_no_row(reserving: Lease, build: Any) -> None:
    before = Command.objects.count()
    with pytest.raises(commands.InvalidCommand):
        services._queue_command(reserving, build(reserving))
    assert Command.objects.count() == before
