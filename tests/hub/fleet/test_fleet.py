"""The staff fleet page and the admin actions that drain hosts, force-release leases and
revoke tokens."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

import supplier_agent
from hub.accounts.api_tokens import authenticate_api_token, create_api_token
from hub.fleet.services import fleet_summary
from hub.leases.models import Command, Lease
from hub.suppliers.models import Gpu, Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

FLEET = "/admin/fleet/"


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def staff_client(client: Client) -> Client:
    client.force_login(f.make_user("admin", is_staff=True))
    return client


def _fleet() -> dict[str, object]:
    """Three hosts: one with a running and a reserving lease, one drained, one offline."""
    busy = f.register_host(gpus=(0, 1, 2))
    running = f.run_lease(busy, [0])
    reserving = f.start_lease(busy, [1])
    drained = f.register_host(gpus=(0,))
    Host.objects.filter(pk=drained.pk).update(maintenance=True)
    gone = f.register_host(gpus=(0, 1))
    f.take_offline(gone)
    Gpu.objects.filter(host=busy, index=2).update(listed=False)
    # One failed command today, one long ago, and one unanswered past its deadline.
    reserve = f.command_of(reserving, Command.Kind.RESERVE)
    now = timezone.now()
    Command.objects.filter(pk=reserve.pk).update(deadline=now - timedelta(seconds=1))
    run = f.command_of(running, Command.Kind.DOCKER_RUN)
    Command.objects.filter(pk=run.pk).update(state=Command.State.FAILED, error="boom")
    old = f.command_of(running, Command.Kind.RESERVE)
    Command.objects.filter(pk=old.pk).update(
        state=Command.State.FAILED, created_at=now - timedelta(days=3)
    )
    return {"busy": busy, "gone": gone, "running": running, "reserving": reserving}


def test_the_fleet_counts_hosts_gpus_leases_and_stuck_commands() -> None:
    rows = _fleet()
    fleet = fleet_summary()
    assert (fleet.hosts_online, fleet.hosts_offline, fleet.hosts_in_maintenance) == (2, 1, 1)
    # 6 GPUs: 2 leased; none free (busy's last is unlisted, drained and offline hosts' aren't).
    assert (fleet.gpus_total, fleet.gpus_leased, fleet.gpus_free) == (6, 2, 0)
    assert fleet.gpus_unavailable == 4
    assert fleet.leases_by_state["running"] == 1
    assert fleet.leases_by_state["reserving"] == 1
    assert fleet.leases_by_state["ended"] == 0
    assert fleet.commands_failed_recently == 1
    assert fleet.commands_overdue == 1
    assert [h.pk for h in fleet.offline_hosts] == [rows["gone"].pk]  # type: ignore[attr-defined]
    assert [c.error for c in fleet.failed_commands] == ["boom"]


def test_a_free_gpu_on_an_online_host_counts_as_free() -> None:
    f.register_host(gpus=(0, 1))
    fleet = fleet_summary()
    assert (fleet.gpus_total, fleet.gpus_free, fleet.gpus_leased) == (2, 2, 0)


def test_staff_see_the_fleet_page(staff_client: Client) -> None:
    _fleet()
    response = staff_client.get(FLEET)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<td data-count="hosts-online">2</td>' in html
    assert '<td data-count="gpus-leased">2</td>' in html
    assert '<td data-count="commands-overdue">1</td>' in html
    assert "boom" in html


def test_the_fleet_page_lists_gpus_delisted_as_failed(staff_client: Client) -> None:
    host = f.register_host()
    Gpu.objects.filter(host=host).update(
        listed=False, unhealthy_since=timezone.now(), unhealthy_reason="NVML lost the GPU"
    )
    assert fleet_summary().gpus_unhealthy == 1
    html = staff_client.get(FLEET).content.decode()
    assert '<td data-count="gpus-unhealthy">1</td>' in html
    assert "NVML lost the GPU" in html


def test_the_fleet_page_counts_hosts_per_agent_version_and_flags_those_behind(
    staff_client: Client,
) -> None:
    current = supplier_agent.__version__
    for version, online in (("0.0.1", True), ("0.0.1", False), (current, True)):
        host = f.register_host()
        Host.objects.filter(pk=host.pk).update(agent_version=version)
        if not online:
            f.take_offline(host)
    versions = {v.version: v for v in fleet_summary().agent_versions}
    assert (versions["0.0.1"].hosts, versions["0.0.1"].online, versions["0.0.1"].behind) == (
        2,
        1,
        True,
    )
    assert (versions[current].hosts, versions[current].behind) == (1, False)
    assert [v.version for v in fleet_summary().agent_versions] == [current, "0.0.1"]
    html = staff_client.get(FLEET).content.decode()
    assert '<td data-version-hosts="0.0.1">2</td>' in html
    assert f"behind this hub&#x27;s {current}" in html or f"behind this hub's {current}" in html
    # Each version links to its hosts in the admin's list (each host's version).
    staff = f.make_user("root", is_staff=True, is_superuser=True)
    staff_client.force_login(staff)
    hosts = staff_client.get("/admin/suppliers/host/?agent_version=0.0.1").content.decode()
    assert "?agent_version=0.0.1" in html
    assert "2 hosts" in hosts


def test_anyone_else_is_sent_to_the_admin_login(client: Client) -> None:
    assert client.get(FLEET).status_code == 302
    client.force_login(f.make_user("renter"))
    response = client.get(FLEET)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def _act(client: Client, model: str, action: str, pks: list[object]) -> None:
    response = client.post(
        reverse(f"admin:{model}_changelist"), {"action": action, "_selected_action": pks}
    )
    assert response.status_code == 302


def test_drain_stops_new_leases_but_not_running_ones_and_undrain_reopens(
    admin_client: Client,
) -> None:
    host = f.register_host(gpus=(0, 1))
    running = f.run_lease(host, [0])
    _act(admin_client, "suppliers_host", "drain", [host.pk])
    host.refresh_from_db()
    assert host.maintenance
    running.refresh_from_db()
    assert running.state == Lease.State.RUNNING
    with pytest.raises(Exception, match="maintenance"):
        f.start_lease(host, [1])
    _act(admin_client, "suppliers_host", "undrain", [host.pk])
    assert f.start_lease(host, [1]).state == Lease.State.RESERVING


def test_force_release_ends_the_lease_with_reason_admin(admin_client: Client) -> None:
    lease = f.run_lease(f.register_host(gpus=(0,)))
    _act(admin_client, "leases_lease", "release", [lease.pk])
    lease.refresh_from_db()
    assert lease.state == Lease.State.STOPPING
    assert lease.end_reason == Lease.EndReason.ADMIN


def test_revoke_agent_and_api_tokens_from_the_admin(admin_client: Client) -> None:
    agent_token, _ = f.make_token()
    _act(admin_client, "suppliers_agenttoken", "revoke", [agent_token.pk])
    agent_token.refresh_from_db()
    assert agent_token.revoked_at is not None

    api_token, plaintext = create_api_token(f.make_user("renter"))
    _act(admin_client, "accounts_apitoken", "revoke", [api_token.pk])
    assert authenticate_api_token(plaintext) is None
    assert admin_client.get(reverse("admin:accounts_apitoken_changelist")).status_code == 200
    assert admin_client.get(reverse("admin:suppliers_host_changelist")).status_code == 200
