"""The market's rules around the ledger (issue 14 items 1-5), each tried the way it was broken:
billing after Stop while the release keeps failing, an outage before running taken off running
time, a price changed under the renter's click, simultaneous rents on money for one, and new
GPUs for rent at $0. The random walk over all of them is test_money_rules.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from pytest_django.fixtures import SettingsWrapper

from hub.accounts.models import User
from hub.billing import metering
from hub.billing import services as billing
from hub.catalog.offers import list_offers
from hub.fleet.services import fleet_summary
from hub.leases import funds, stuck_releases
from hub.leases import services as leases
from hub.leases.models import Command, Lease
from hub.suppliers import services as suppliers
from hub.suppliers.models import Gpu, Host
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

State = Lease.State
PRICE = 36_000_000  # $36/h: 10,000 micros a second
UNIT = 1_000_000


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def admin_user(db: None) -> User:
    return f.make_user("admin", is_staff=True)


def _funded(admin_user: User, micros: int = 100 * UNIT) -> User:
    renter = f.make_user("renter")
    billing.adjust(renter, micros, "test top-up", admin_user)
    return renter


def _priced_host(price: int = PRICE, gpus: tuple[int, ...] = (0,)) -> Host:
    host = f.register_host(gpus=list(gpus))
    Gpu.objects.filter(host=host).update(price_per_hour_micros=price)
    return host


def _run(host: Host, renter: User, now: datetime, index: int = 0) -> Lease:
    return f.run_lease_of(renter, host, now, index)


# --- 1. billing ends at the stop request ---------------------------------------------------------


def test_a_failing_release_bills_nothing_after_stop_and_flags_the_host(
    admin_user: User, settings: SettingsWrapper
) -> None:
    settings.RELEASE_STUCK_AFTER_S = 300
    host = _priced_host()
    renter = _funded(admin_user)
    t0 = timezone.now()
    lease = _run(host, renter, t0)

    stopped = leases.release_lease(lease.pk, now=t0 + timedelta(seconds=40))
    assert stopped.state == State.STOPPING
    assert stopped.stop_requested_at == t0 + timedelta(seconds=40)
    # The release fails on the host, again and again.
    for minute in range(1, 12):
        release = f.command_of(lease, Command.Kind.RELEASE)
        later = t0 + timedelta(minutes=minute)
        assert f.ack(release, ok=False, error="container would not stop", now=later)
        funds.charge_and_release(now=later)
    lease.refresh_from_db()
    assert lease.state == State.STOPPING
    assert lease.charged_micros == 40 * PRICE // 3600  # 40 s, not 11 minutes
    assert billing.balance_micros(renter) == 100 * UNIT - 40 * PRICE // 3600

    # Past RELEASE_STUCK_AFTER_S the host is flagged, with the agent's words.
    assert stuck_releases.flag_stuck_releases(now=t0 + timedelta(seconds=339)) == []
    assert stuck_releases.flag_stuck_releases(now=t0 + timedelta(seconds=341)) == [host.pk]
    host.refresh_from_db()
    assert host.release_stuck_since is not None
    assert "container would not stop" in host.release_stuck_reason
    # ...takes no new rentals, on the offers or by id...
    other = Gpu.objects.create(
        host=host, index=1, uuid="GPU-x", name="H100", price_per_hour_micros=1
    )
    assert not [o for o in list_offers() if o.host_id == host.pk]
    with pytest.raises(leases.LeaseError, match="not been able to release"):
        leases.start_lease(_funded(admin_user), host, [other.index], f.lease_spec())
    # ...shows on the fleet page and to its owner, and the renter reads "no longer billed".
    assert fleet_summary().hosts_release_stuck == 1
    supplier = Client()
    supplier.force_login(host.owner)
    page = supplier.get(reverse("web:hosts")).content.decode()
    assert "release stuck" in page
    assert "container would not stop" in page
    renter_client = Client()
    renter_client.force_login(renter)
    lease_page = renter_client.get(reverse("web:lease", args=[lease.pk])).content.decode()
    assert "no longer billed" in lease_page

    # The release finally goes through: the lease ends, still at 40 s, and the flag clears.
    release = f.command_of(lease, Command.Kind.RELEASE)
    assert f.ack(release, now=t0 + timedelta(minutes=20))
    lease.refresh_from_db()
    assert lease.state == State.ENDED
    assert lease.charged_micros == 40 * PRICE // 3600
    assert stuck_releases.flag_stuck_releases(now=t0 + timedelta(minutes=21)) == []
    host.refresh_from_db()
    assert host.release_stuck_since is None
    assert host.release_stuck_reason == ""


def test_a_stop_before_running_bills_nothing_even_if_the_container_starts(
    admin_user: User,
) -> None:
    host = _priced_host()
    renter = _funded(admin_user)
    t0 = timezone.now()
    lease = leases.start_lease(renter, host, [0], f.lease_spec())
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), now=t0)
    leases.release_lease(lease.pk, now=t0 + timedelta(seconds=5))
    # The docker_run the agent was already carrying out answers late: it changes nothing.
    assert not f.ack(
        f.command_of(lease, Command.Kind.DOCKER_RUN),
        result={"container_id": "c1"},
        now=t0 + timedelta(seconds=30),
    )
    funds.charge_and_release(now=t0 + timedelta(minutes=10))
    lease.refresh_from_db()
    assert lease.running_since is None
    assert lease.charged_micros == 0


# --- 2. outages count only while running ----------------------------------------------------------


def test_an_outage_while_starting_is_not_taken_off_running_time(admin_user: User) -> None:
    host = _priced_host()
    renter = _funded(admin_user)
    t0 = timezone.now()
    lease = leases.start_lease(renter, host, [0], f.lease_spec())
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE), now=t0)
    # Away for 22 s while the container is still starting...
    leases.note_host_lost(host.pk, t0 + timedelta(seconds=1))
    leases.note_host_back(host.pk, t0 + timedelta(seconds=23))
    # ...then it runs for 40 s.
    running = t0 + timedelta(seconds=30)
    assert f.ack(
        f.command_of(lease, Command.Kind.DOCKER_RUN), result={"container_id": "c"}, now=running
    )
    leases.release_lease(lease.pk, now=running + timedelta(seconds=40))
    lease.refresh_from_db()
    assert lease.offline_duration == timedelta(0)
    assert lease.charged_micros == 40 * PRICE // 3600  # not 18 s


def test_an_outage_spanning_the_start_of_running_counts_only_its_running_part(
    admin_user: User,
) -> None:
    host = _priced_host()
    lease = _run(host, _funded(admin_user), timezone.now())
    start = lease.running_since
    # Recorded lost before it ran (a stale mark): only the part after running_since counts.
    Lease.objects.filter(pk=lease.pk).update(host_lost_since=start - timedelta(seconds=50))
    leases.note_host_back(host.pk, start + timedelta(seconds=10))
    leases.release_lease(lease.pk, now=start + timedelta(seconds=60))
    lease.refresh_from_db()
    assert lease.offline_duration == timedelta(seconds=10)
    assert lease.charged_micros == 50 * PRICE // 3600


def test_an_outage_after_the_stop_request_changes_nothing(admin_user: User) -> None:
    host = _priced_host()
    lease = _run(host, _funded(admin_user), timezone.now())
    start = lease.running_since
    leases.release_lease(lease.pk, now=start + timedelta(seconds=60))
    leases.note_host_lost(host.pk, start + timedelta(seconds=70))
    leases.note_host_back(host.pk, start + timedelta(seconds=200))
    lease.refresh_from_db()
    assert lease.offline_duration == timedelta(0)
    assert lease.charged_micros == 60 * PRICE // 3600


# --- 3. the price the renter saw ------------------------------------------------------------


def test_a_price_raised_under_the_click_is_refused_with_the_new_price(admin_user: User) -> None:
    host = _priced_host(UNIT)
    renter = _funded(admin_user, 1000 * UNIT)
    gpu = host.gpus.get()
    suppliers.set_gpu_terms(gpu.pk, price_per_hour_micros=300 * UNIT)
    with pytest.raises(leases.PriceChanged) as refused:
        leases.start_lease(renter, host, [0], f.lease_spec(), max_price_per_hour_micros=UNIT)
    assert refused.value.price_per_hour_micros == 300 * UNIT
    assert "$300.00" in str(refused.value)
    assert not Lease.objects.filter(renter=renter).exists()
    # A lower price is fine, and so is the new one once the renter accepts it.
    suppliers.set_gpu_terms(gpu.pk, price_per_hour_micros=UNIT // 2)
    lease = leases.start_lease(renter, host, [0], f.lease_spec(), max_price_per_hour_micros=UNIT)
    assert lease.price_per_hour_micros == UNIT // 2


def test_the_api_answers_409_with_the_new_price(admin_user: User) -> None:
    from rest_framework.test import APIClient

    host = _priced_host(UNIT)
    renter = _funded(admin_user, 1000 * UNIT)
    client = APIClient()
    client.force_login(renter)
    gpu = host.gpus.get()
    suppliers.set_gpu_terms(gpu.pk, price_per_hour_micros=300 * UNIT)
    body = {"gpu_ids": [gpu.pk], "image": "busybox", "max_price_per_hour": "1.00"}
    response = client.post("/api/v1/leases/", body, format="json")
    assert response.status_code == 409, response.content
    assert response.json()["price_per_hour"] == "$300.00"
    assert response.json()["price_per_hour_micros"] == 300 * UNIT
    assert "price changed" in response.json()["detail"]
    assert not Lease.objects.filter(renter=renter).exists()
    body["max_price_per_hour"] = "300"
    assert client.post("/api/v1/leases/", body, format="json").status_code == 201


def test_the_rent_page_carries_the_price_it_showed(admin_user: User) -> None:
    host = _priced_host(UNIT)
    renter = _funded(admin_user, 1000 * UNIT)
    gpu = host.gpus.get()
    client = Client()
    client.force_login(renter)
    page = client.get(reverse("web:rent", args=[gpu.pk])).content.decode()
    assert f'name="seen_price_micros" value="{UNIT}"' in page
    assert page.count('name="seen_price_micros"') == 1  # a second, empty one would win
    suppliers.set_gpu_terms(gpu.pk, price_per_hour_micros=300 * UNIT)
    refused = client.post(
        reverse("web:rent", args=[gpu.pk]), {"image": "busybox", "seen_price_micros": str(UNIT)}
    )
    assert refused.status_code == 400
    body = refused.content.decode()
    assert "price changed" in body.lower()
    assert f'name="seen_price_micros" value="{300 * UNIT}"' in body  # the new one, to accept
    assert not Lease.objects.filter(renter=renter).exists()
    # Without the field (a hand-made POST) nothing is rented either.
    assert client.post(reverse("web:rent", args=[gpu.pk]), {"image": "b"}).status_code == 400
    assert not Lease.objects.filter(renter=renter).exists()


# --- 4. the funds check counts every active lease, under a per-renter lock ------------------------


def test_leases_still_starting_count_against_the_funds(admin_user: User) -> None:
    host = _priced_host(60 * UNIT, gpus=(0, 1, 2))  # $1 a minute each
    renter = _funded(admin_user, UNIT + UNIT // 2)  # a minute and a half of one GPU
    leases.start_lease(renter, host, [0], f.lease_spec())  # reserving, not running
    with pytest.raises(leases.LeaseError, match="out of funds"):
        leases.start_lease(renter, host, [1], f.lease_spec())
    assert Lease.objects.filter(renter=renter).count() == 1


@pytest.mark.django_db(transaction=True)
def test_simultaneous_rents_cannot_overdraw(admin_user: User) -> None:
    # Four hosts: rents on one host already queue on its row; these must queue on the renter.
    hosts = [_priced_host(60 * UNIT) for _ in range(4)]
    renter = _funded(admin_user, UNIT + UNIT // 2)
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def rent(index: int) -> None:
        try:
            barrier.wait(timeout=10)
            leases.start_lease(renter, hosts[index], [0], f.lease_spec())
            outcomes.append("rented")
        except leases.LeaseError as exc:
            outcomes.append(str(exc))
        finally:
            connection.close()

    threads = [threading.Thread(target=rent, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert outcomes.count("rented") == 1, outcomes
    assert Lease.objects.filter(renter=renter).count() == 1


# --- 5. new GPUs are unlisted until priced --------------------------------------------------


def test_a_new_gpu_is_not_for_rent_until_its_supplier_prices_it() -> None:
    token, _ = f.make_token(default_price_per_hour_micros=None)
    host = f.register_host(token)
    gpu = host.gpus.get()
    assert (gpu.listed, gpu.priced) == (False, False)
    assert not [o for o in list_offers() if o.host_id == host.pk]
    with pytest.raises(leases.LeaseError, match="not for rent"):
        f.start_lease(host)
    with pytest.raises(suppliers.SupplierError, match="set a price"):
        suppliers.set_gpu_terms(gpu.pk, listed=True)
    # Even an admin's bulk "listed" cannot rent an unpriced GPU.
    Gpu.objects.filter(pk=gpu.pk).update(listed=True)
    with pytest.raises(leases.LeaseError, match="not for rent"):
        f.start_lease(host)
    suppliers.set_gpu_terms(gpu.pk, price_per_hour_micros=0, listed=True)  # free, on purpose
    assert [o.gpu_id for o in list_offers() if o.host_id == host.pk] == [gpu.pk]


def test_host_and_token_defaults_price_new_gpus() -> None:
    token, _ = f.make_token(default_price_per_hour_micros=2 * UNIT)
    host = f.register_host(token, gpus=[0])
    assert host.gpus.get().price_per_hour_micros == 2 * UNIT
    assert host.gpus.get().listed
    # The host's own default wins over the token's, for GPUs it adds later only.
    suppliers.set_host_default_price(host.pk, 3 * UNIT)
    f.register_host(token, agent_id=str(host.agent_id), gpus=[0, 1])
    prices = dict(host.gpus.values_list("index", "price_per_hour_micros"))
    assert prices == {0: 2 * UNIT, 1: 3 * UNIT}
    with pytest.raises(suppliers.SupplierError):
        suppliers.set_host_default_price(host.pk, -1)


def test_minus_zero_is_stored_and_shown_as_zero() -> None:
    token, _ = f.make_token(default_price_per_hour_micros=None)
    host = f.register_host(token)
    gpu = host.gpus.get()
    client = Client()
    client.force_login(host.owner)
    response = client.post(
        reverse("web:gpu-terms", args=[gpu.pk]),
        {f"gpu{gpu.pk}-price": "-0", f"gpu{gpu.pk}-listed": "on"},
        follow=True,
    )
    gpu.refresh_from_db()
    assert (gpu.price_per_hour_micros, gpu.priced, gpu.listed) == (0, True, True)
    body = response.content.decode()
    assert "$0.00/h" in body
    assert "$-0" not in body
    assert metering.per_minute(gpu.price_per_hour_micros) == 0


# --- the agent's dead-man switch gets the time the balance carries --------------------------


def test_docker_run_says_how_long_the_balance_carries_the_renters_rentals(
    admin_user: User,
) -> None:
    import json

    from supplier_agent.protocol import parse_message

    host = _priced_host(60 * UNIT, gpus=(0, 1))  # $1 a minute each
    renter = _funded(admin_user, 10 * UNIT)
    leases.start_lease(renter, host, [1], f.lease_spec())  # another $1/min, still starting
    lease = leases.start_lease(renter, host, [0], f.lease_spec())
    before = timezone.now()
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE))
    payload = f.command_of(lease, Command.Kind.DOCKER_RUN).payload
    paid_until = datetime.fromisoformat(payload["paid_until"])
    # $10 at $2 a minute: five minutes.
    assert before + timedelta(minutes=5) - timedelta(seconds=5) <= paid_until
    assert paid_until <= timezone.now() + timedelta(minutes=5)
    assert parse_message(json.dumps(payload)).paid_until == payload["paid_until"]

    free_host = _priced_host(0)
    free = leases.start_lease(renter, free_host, [0], f.lease_spec())
    assert f.ack(f.command_of(free, Command.Kind.RESERVE))
    assert "paid_until" not in f.command_of(free, Command.Kind.DOCKER_RUN).payload
