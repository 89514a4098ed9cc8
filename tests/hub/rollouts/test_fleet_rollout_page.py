"""The fleet page starts, pauses, resumes and aborts a rollout, and shows where it stands."""

from __future__ import annotations

import pytest
from django.test import Client

from hub.rollouts.models import Rollout, RolloutHost
from hub.suppliers.models import Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

FLEET = "/admin/fleet/"


@pytest.fixture
def staff_client(client: Client) -> Client:
    client.force_login(f.make_user("admin", is_staff=True, is_superuser=True))
    return client


def _host(version: str) -> Host:
    host = f.register_host()
    Host.objects.filter(pk=host.pk).update(agent_version=version)
    host.refresh_from_db()
    return host


def test_a_rollout_is_started_and_steered_from_the_fleet_page(staff_client: Client) -> None:
    first, _ = _host("0.3.0"), _host("0.3.0")
    page = staff_client.get(FLEET).content.decode()
    assert "Roll out <strong>0.4.0</strong>" in page
    response = staff_client.post(
        f"{FLEET}rollouts/",
        {"waves": "50,100", "first_hosts": first.short_id, "pause_s": "30"},
        follow=True,
    )
    page = response.content.decode()
    assert "Rollout of 0.4.0 started." in page
    rollout = Rollout.objects.get()
    assert (rollout.percents, rollout.pause_s, rollout.named_first) == ([50, 100], 30, True)
    assert RolloutHost.objects.get(rollout=rollout, host=first).wave == 1
    assert "data-rollout-state>running</strong>" in page
    assert "Start rollout" not in page  # one at a time
    for action, state in (("pause", "paused"), ("resume", "running"), ("abort", "aborted")):
        response = staff_client.post(f"{FLEET}rollouts/{rollout.pk}/{action}/", follow=True)
        assert f"Rollout of 0.4.0: {state}." in response.content.decode()
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.ABORTED
    assert rollout.reason.startswith("aborted by admin")
    # Only a rollout's own actions, only by POST.
    assert staff_client.post(f"{FLEET}rollouts/{rollout.pk}/explode/").status_code == 404
    assert staff_client.get(f"{FLEET}rollouts/{rollout.pk}/abort/").status_code == 405


def test_bad_rollout_input_is_said_on_the_page_and_starts_nothing(staff_client: Client) -> None:
    _host("0.3.0")
    for form, words in [
        ({"waves": "50,10"}, "larger than the one before"),
        ({"waves": "100", "pause_s": "soon"}, "pause: a number of seconds"),
        ({"waves": "100", "pause_s": "-1"}, "pause: from 0 s to a week"),
        ({"waves": "100", "first_hosts": "nosuch"}, "no single host is"),
    ]:
        response = staff_client.post(f"{FLEET}rollouts/", form, follow=True)
        assert words.lower() in response.content.decode().lower()
    assert not Rollout.objects.exists()


def test_only_staff_steer_rollouts(client: Client) -> None:
    _host("0.3.0")
    client.force_login(f.make_user("renter"))
    response = client.post(f"{FLEET}rollouts/", {"waves": "100"})
    assert response.status_code == 302
    assert not Rollout.objects.exists()


def test_staff_without_the_rollout_permissions_see_it_but_cannot_steer_it(client: Client) -> None:
    _host("0.3.0")
    client.force_login(f.make_user("viewer", is_staff=True))
    page = client.get(FLEET).content.decode()
    assert "Agent rollout" in page
    assert "Start rollout" not in page
    assert client.post(f"{FLEET}rollouts/", {"waves": "100"}).status_code == 403
    assert not Rollout.objects.exists()
