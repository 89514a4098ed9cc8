"""Where each notification kind is emitted (issue 36): the real transition, driven through its
service, writes exactly one event (one item, for a coalesced kind) for the right account with
the fields its wording needs; a repeated or no-op transition writes none; no secret in data."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from pytest_django.fixtures import SettingsWrapper

from hub.accounts.api_tokens import create_api_token
from hub.accounts.models import User
from hub.accounts.ssh_keys import SshKeyError, add_ssh_key
from hub.billing import low_balance, payments, payouts, topups
from hub.billing import services as billing
from hub.billing.models import LedgerEntry
from hub.leases import funds, gpu_faults, host_status, stuck_releases
from hub.leases import services as leases
from hub.leases.models import Command, Lease
from hub.notifications import emails, endpoints, wording
from hub.notifications.kinds import KINDS
from hub.notifications.models import Event, NotificationSettings
from hub.suppliers import services as suppliers
from hub.suppliers.models import Gpu, Host
from supplier_agent.protocol import GpuHealth, GpuHealthReport
from tests.hub import factories as f
from tests.hub.accounts.test_ssh_keys import keygen

pytestmark = pytest.mark.django_db

State = Lease.State
UNIT = 1_000_000
PRICE = 36 * UNIT  # $36 an hour: 10,000 micros a second


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture(autouse=True)
def every_event_reads_whole() -> Iterator[None]:
    """Each event a test's emitters made has every field its email's words name, and its
    email (text and HTML) renders."""
    yield
    for event in Event.objects.select_related("account"):
        assert wording.missing_fields(event) == set(), (event.kind, event.data)
        mail = emails.message(event, event.account)
        assert mail.subject.startswith("CloudGPU: ")
        assert "?" not in mail.body.split("Open CloudGPU")[0], mail.body


@pytest.fixture
def admin() -> User:
    return f.make_user("admin", is_staff=True)


def events(account: User | int, kind: str) -> list[Event]:
    account_id = account if isinstance(account, int) else account.pk
    return list(Event.objects.filter(account_id=account_id, kind=kind).order_by("created_at"))


def items(account: User | int, kind: str) -> list[dict[str, Any]]:
    """Every item of the account's events of a coalesced kind (a burst joins one event)."""
    assert KINDS[kind].coalesce
    return [item for event in events(account, kind) for item in event.data["items"]]


def only(account: User | int, kind: str) -> dict[str, Any]:
    """The one thing of this kind the account heard: the event's data, or the one item."""
    if KINDS[kind].coalesce:
        found = items(account, kind)
        assert len(found) == 1, found
        assert [e.data["count"] for e in events(account, kind)] == [1]
        return found[0]
    found_events = events(account, kind)
    assert len(found_events) == 1, [e.data for e in found_events]
    return found_events[0].data


def no_other_kind(kind: str) -> None:
    # json-serialisable and one kind only: nothing else fired by the same transition.
    assert set(Event.objects.values_list("kind", flat=True)) <= {kind}


def _priced_host(price: int = PRICE, gpus: tuple[int, ...] = (0,)) -> Host:
    host = f.register_host(gpus=list(gpus))
    Gpu.objects.filter(host=host).update(price_per_hour_micros=price)
    return host


def _funded(admin: User, micros: int) -> User:
    renter = f.make_user("renter")
    billing.adjust(renter, micros, "test top-up", admin)
    return renter


def _run(host: Host, renter: User, now: datetime, index: int = 0) -> Lease:
    return f.run_lease_of(renter, host, now, index)


# --- rentals -------------------------------------------------------------------------------------


def test_running_is_told_once_with_host_gpus_and_image() -> None:
    host = f.register_host(gpus=[0, 1])
    lease = f.start_lease(host, [0, 1])
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE))
    assert not events(lease.renter_id, "rental.running")  # starting is not running
    run = f.command_of(lease, Command.Kind.DOCKER_RUN)
    assert f.ack(run, result={"container_id": "c1"})
    assert not f.ack(run, result={"container_id": "c1"})  # the agent repeats itself

    item = only(lease.renter_id, "rental.running")
    assert item == {
        "lease": str(lease.pk),
        "host": host.label,
        "gpus": "2\u00d7 NVIDIA GeForce RTX 4090",
        "image": f.TEST_IMAGE,
    }
    assert not events(host.owner_id, "rental.running")  # the renter's, not the supplier's


def test_failed_is_told_once_whether_the_reserve_or_the_run_fails() -> None:
    host = f.register_host(gpus=[0, 1])
    refused = f.start_lease(host, [0])
    assert f.ack(f.command_of(refused, Command.Kind.RESERVE), ok=False, error="GPU held by foo")
    item = only(refused.renter_id, "rental.failed")
    assert item["lease"] == str(refused.pk)
    assert "in use by another platform" in item["reason"]

    broken = f.start_lease(host, [1])
    assert f.ack(f.command_of(broken, Command.Kind.RESERVE))
    assert f.ack(f.command_of(broken, Command.Kind.DOCKER_RUN), ok=False, error="image not found")
    item = only(broken.renter_id, "rental.failed")
    assert item == {"lease": str(broken.pk), "reason": item["reason"]}
    assert "could not be found" in item["reason"]
    # The release that follows a failure ends it as failed: nothing more to tell.
    assert f.ack(f.command_of(broken, Command.Kind.RELEASE))
    broken.refresh_from_db()
    assert broken.state == State.FAILED
    assert len(items(broken.renter_id, "rental.failed")) == 1
    assert not events(broken.renter_id, "rental.ended")


def test_a_start_past_its_deadline_fails_once() -> None:
    host = f.register_host()
    lease = f.start_lease(host)
    reserve = f.command_of(lease, Command.Kind.RESERVE)
    leases.expire_command(reserve.pk)
    leases.expire_command(reserve.pk)  # the deadline sweep again
    assert only(lease.renter_id, "rental.failed")["reason"] == "The host did not answer in time."


def test_ended_is_told_once_at_the_stop_with_what_the_ledger_charged(admin: User) -> None:
    host = _priced_host()
    renter = _funded(admin, 100 * UNIT)
    t0 = timezone.now()
    lease = _run(host, renter, t0)
    leases.release_lease(lease.pk, now=t0 + timedelta(seconds=40))
    leases.release_lease(lease.pk, now=t0 + timedelta(seconds=90))  # a second click
    assert f.ack(f.command_of(lease, Command.Kind.RELEASE))  # the host confirms: ended
    lease.refresh_from_db()
    assert lease.state == State.ENDED

    item = only(renter, "rental.ended")
    charged = -sum(
        LedgerEntry.objects.filter(lease=lease, kind=LedgerEntry.Kind.CHARGE).values_list(
            "amount_micros", flat=True
        )
    )
    assert charged == 40 * 10_000
    assert item == {
        "lease": str(lease.pk),
        "reason": "renter stop",
        "cost": "0.40",
        "cost_micros": charged,
    }


def test_a_lease_the_host_lost_ends_once(settings: SettingsWrapper) -> None:
    host = f.register_host()
    lease = f.run_lease(host)
    now = timezone.now()
    assert host_status.host_lost(host.pk, "no heartbeat", now)
    later = now + timedelta(seconds=settings.LEASE_HOST_GRACE_S + 1)
    assert leases.end_leases_of_lost_hosts(later) == [str(lease.pk)]
    assert leases.end_leases_of_lost_hosts(later) == []
    # The agent, back, confirms the release the hub queued: still ended once.
    assert f.ack(f.command_of(lease, Command.Kind.RELEASE))
    item = only(lease.renter_id, "rental.ended")
    assert item["reason"] == "host lost"
    assert (item["cost"], item["cost_micros"]) == ("0.00", 0)  # a free GPU


def test_a_lease_a_restarted_host_no_longer_runs_ends_once() -> None:
    token, _ = f.make_token()
    host = f.register_host(token)
    lease = f.run_lease(host)
    for _ in range(2):  # the agent registers again without the claim, twice
        f.register_host(token, agent_id=str(host.agent_id))
    lease.refresh_from_db()
    assert lease.state == State.ENDED
    assert only(lease.renter_id, "rental.ended")["reason"] == "host lost"


def test_a_rental_stopped_before_running_ends_once_and_never_fails() -> None:
    host = f.register_host()
    lease = f.start_lease(host)
    leases.release_lease(lease.pk)
    # The reserve's late failure changes nothing: it was withdrawn with the stop.
    assert not f.ack(f.command_of(lease, Command.Kind.RESERVE), ok=False, error="too late")
    assert f.ack(f.command_of(lease, Command.Kind.RELEASE))
    assert only(lease.renter_id, "rental.ended")["reason"] == "renter stop"
    assert not events(lease.renter_id, "rental.failed")
    assert not events(lease.renter_id, "rental.running")


# --- hosts ---------------------------------------------------------------------------------------


def test_offline_and_back_are_told_once_each_to_the_hosts_owner() -> None:
    host = f.register_host()
    assert not events(host.owner_id, "host.online")  # a new host is not "back"
    f.take_offline(host)
    assert not host_status.host_lost(host.pk, "no heartbeat", timezone.now())  # a racing sweep
    offline = only(host.owner_id, "host.offline")
    assert offline["host"] == str(host.pk)
    assert offline["name"] == host.label
    assert datetime.fromisoformat(offline["at"]).tzinfo is not None

    assert host_status.host_back(host.pk, "heartbeat")
    assert not host_status.host_back(host.pk, "heartbeat (telemetry flush)")
    online = only(host.owner_id, "host.online")
    assert set(online) == {"host", "name", "at"}
    assert online["host"] == str(host.pk)


def test_a_re_registration_brings_an_offline_host_back_once() -> None:
    token, _ = f.make_token()
    host = f.register_host(token)
    f.take_offline(host)
    f.register_host(token, agent_id=str(host.agent_id))
    f.register_host(token, agent_id=str(host.agent_id))  # online already: nothing to tell
    host.refresh_from_db()
    assert host.status == Host.Status.ONLINE
    assert only(host.owner_id, "host.online")["name"] == host.label


# --- GPUs ----------------------------------------------------------------------------------------


def _fault(host: Host, index: int) -> list[gpu_faults.Fault]:
    uuid = Gpu.objects.get(host=host, index=index).uuid
    report = GpuHealthReport(gpus=(GpuHealth(index=index, uuid=uuid, xids=(79,), xid_count=1),))
    return gpu_faults.faults_in(report)


def test_a_listed_gpu_that_fails_is_delisted_once() -> None:
    host = f.register_host(gpus=[0, 1])
    assert gpu_faults.delist_failed_gpus(host.pk, _fault(host, 1)) == [1]
    assert gpu_faults.delist_failed_gpus(host.pk, _fault(host, 1)) == []  # the next report
    item = only(host.owner_id, "gpu.delisted")
    gpu = Gpu.objects.get(host=host, index=1)
    assert item == {"host": host.label, "gpu": 1, "uuid": gpu.uuid, "reason": gpu.unhealthy_reason}
    assert "XID 79" in item["reason"]
    assert not events(host.owner_id, "gpu.fault")


def test_an_unlisted_gpu_that_fails_is_a_fault_not_a_delisting() -> None:
    host = f.register_host(gpus=[0])
    gpu = Gpu.objects.get(host=host, index=0)
    suppliers.set_gpu_terms(gpu.pk, listed=False)
    assert gpu_faults.delist_failed_gpus(host.pk, _fault(host, 0)) == [0]
    assert gpu_faults.delist_failed_gpus(host.pk, _fault(host, 0)) == []
    item = only(host.owner_id, "gpu.fault")
    assert set(item) == {"host", "gpu", "uuid", "reason"}
    assert item["uuid"] == gpu.uuid
    assert not events(host.owner_id, "gpu.delisted")


# --- releases ------------------------------------------------------------------------------------


def test_a_stuck_release_is_told_once_when_the_host_is_flagged(settings: SettingsWrapper) -> None:
    settings.RELEASE_STUCK_AFTER_S = 300
    host = f.register_host()
    t0 = timezone.now()
    lease = f.run_lease(host)
    leases.release_lease(lease.pk, now=t0)
    assert f.ack(f.command_of(lease, Command.Kind.RELEASE), ok=False, error="would not stop")
    assert stuck_releases.flag_stuck_releases(now=t0 + timedelta(seconds=200)) == []
    assert not events(host.owner_id, "release.stuck")
    assert stuck_releases.flag_stuck_releases(now=t0 + timedelta(seconds=301)) == [host.pk]
    assert stuck_releases.flag_stuck_releases(now=t0 + timedelta(seconds=400)) == []  # flagged
    assert only(host.owner_id, "release.stuck") == {
        "lease": str(lease.pk),
        "host": host.label,
        "error": "would not stop",
    }
    assert not events(lease.renter_id, "release.stuck")


# --- money ---------------------------------------------------------------------------------------


def test_an_admin_top_up_is_credited_once_and_a_correction_not(admin: User) -> None:
    renter = f.make_user("renter")
    request = topups.request_top_up(renter, 25 * UNIT)
    topups.add_top_up(renter, 25 * UNIT, "bank transfer", admin, answers=request.pk)
    assert only(renter, "topup.credited") == {
        "amount": "25.00",
        "amount_micros": 25 * UNIT,
        "balance": "25.00",
        "balance_micros": 25 * UNIT,
    }
    billing.adjust(renter, -5 * UNIT, "correction", admin)
    assert len(events(renter, "topup.credited")) == 1
    billing.adjust(renter, 1_234_567, "goodwill", admin)  # the admin action's own path
    assert [e.data["balance"] for e in events(renter, "topup.credited")] == ["25.00", "21.23"]


def test_a_payment_is_credited_once_however_often_the_processor_says_so() -> None:
    renter = f.make_user("renter")
    for _ in range(2):
        payments.record_payment(renter, 12_340_000, processor="test", external_ref="pay_1")
    data = only(renter, "topup.credited")
    assert (data["amount"], data["amount_micros"], data["balance"]) == (
        "12.34",
        12_340_000,
        "12.34",
    )


def test_payouts_are_told_when_requested_paid_and_refused(admin: User) -> None:
    supplier = f.make_user("supplier")
    LedgerEntry.objects.create(
        account=supplier, kind=LedgerEntry.Kind.EARNING, amount_micros=100 * UNIT
    )
    paid = payouts.request_payout(supplier, 30 * UNIT)
    assert only(supplier, "payout.requested") == {
        "payout": str(paid.pk),
        "amount": "30.00",
        "amount_micros": 30 * UNIT,
    }
    payouts.mark_payout_paid(paid.pk, "SEPA 4711", admin)
    with pytest.raises(billing.BillingError):
        payouts.mark_payout_paid(paid.pk, "again", admin)
    assert only(supplier, "payout.paid") == {
        "payout": str(paid.pk),
        "amount": "30.00",
        "amount_micros": 30 * UNIT,
    }

    refused = payouts.request_payout(supplier, 20 * UNIT)
    withdrawn = payouts.request_payout(supplier, 10 * UNIT)
    assert payouts.cancel_payout(refused.pk, admin, reason="  the IBAN  is wrong ")
    assert not payouts.cancel_payout(refused.pk, admin)  # cancelled already
    assert payouts.cancel_payout(withdrawn.pk, supplier)  # their own: not a refusal
    assert only(supplier, "payout.refused") == {
        "payout": str(refused.pk),
        "amount": "20.00",
        "amount_micros": 20 * UNIT,
        "reason": "the IBAN is wrong",
    }
    assert len(events(supplier, "payout.requested")) == 3


def test_a_refusal_without_words_still_gives_a_reason(admin: User) -> None:
    supplier = f.make_user("supplier")
    LedgerEntry.objects.create(
        account=supplier, kind=LedgerEntry.Kind.EARNING, amount_micros=100 * UNIT
    )
    payout = payouts.request_payout(supplier, 50 * UNIT)
    assert payouts.cancel_payout(payout.pk, admin)
    assert only(supplier, "payout.refused")["reason"] == payouts.REFUSED_WITHOUT_REASON


# --- security ------------------------------------------------------------------------------------


def test_a_new_api_token_is_told_without_its_secret() -> None:
    user = f.make_user()
    token, plaintext = create_api_token(user, "ci runner", ["read", "leases"])
    data = only(user, "security.api_token_created")
    assert data == {"name": "ci runner", "prefix": token.prefix, "scopes": ["read", "leases"]}
    serialised = json.dumps(data)
    assert plaintext not in serialised
    assert token.digest not in serialised
    no_other_kind("security.api_token_created")


def test_a_new_ssh_key_is_told_once(tmp_path: Path) -> None:
    user = f.make_user()
    line = keygen(tmp_path, comment="alice@laptop")
    key = add_ssh_key(user, line)
    with pytest.raises(SshKeyError):
        add_ssh_key(user, line)  # already added: refused, nothing told
    assert only(user, "security.ssh_key_added") == {
        "fingerprint": key.fingerprint,
        "comment": "alice@laptop",
    }


def test_a_new_webhook_endpoint_is_told_with_its_host_only(settings: SettingsWrapper) -> None:
    settings.WEBHOOK_ALLOW_LOOPBACK = True
    user = f.make_user()
    endpoint = endpoints.add(user, "http://localhost:8080/in/s3cret-path", kinds=["gpu.fault"])
    with pytest.raises(endpoints.EndpointError):
        endpoints.add(user, "http://10.0.0.1/x")  # refused: nothing told
    assert only(user, "security.webhook_added") == {
        "endpoint": endpoint.pk,
        "host": "localhost",
        "kinds": ["gpu.fault"],
    }
    no_other_kind("security.webhook_added")


# --- low balance ---------------------------------------------------------------------------------


def _threshold(renter: User, micros: int | None) -> None:
    NotificationSettings.objects.create(user=renter, low_balance_threshold_micros=micros)


def _notified_at(renter: User) -> datetime | None:
    return (
        NotificationSettings.objects.filter(user=renter)
        .values_list("low_balance_notified_at", flat=True)
        .first()
    )


def test_low_balance_is_told_once_per_crossing_and_again_after_a_top_up(admin: User) -> None:
    renter = _funded(admin, 10 * UNIT)
    _threshold(renter, 5 * UNIT)
    host = _priced_host(gpus=(0, 1))
    t0 = timezone.now()
    first = _run(host, renter, t0, index=0)
    second = _run(host, renter, t0, index=1)  # $72/h in all: 20,000 micros a second

    funds.charge_and_release(now=t0 + timedelta(seconds=200))  # $6 left
    assert not events(renter, "balance.low")
    assert _notified_at(renter) is None

    crossed = t0 + timedelta(seconds=300)  # $4 left
    funds.charge_and_release(now=crossed)
    data = only(renter, "balance.low")
    assert data == {
        "balance": "4.00",
        "balance_micros": 4 * UNIT,
        "threshold": "5.00",
        "threshold_micros": 5 * UNIT,
        "burn_per_hour": "72.00",
        "burn_per_hour_micros": 2 * PRICE,
        # $4 at $72/h: 200 s.
        "runs_out_at": (crossed + timedelta(seconds=200)).isoformat(timespec="seconds"),
        "rentals": [
            {"lease": str(first.pk), "price_per_hour": "36.00", "price_per_hour_micros": PRICE},
            {"lease": str(second.pk), "price_per_hour": "36.00", "price_per_hour_micros": PRICE},
        ],
    }
    assert _notified_at(renter) == crossed

    funds.charge_and_release(now=t0 + timedelta(seconds=330))  # still below: nothing new
    assert len(events(renter, "balance.low")) == 1

    # A top-up back above re-arms it at once; the next crossing is told again.
    topups.add_top_up(renter, 10 * UNIT, "more", admin)  # $13.40
    assert _notified_at(renter) is None
    funds.charge_and_release(now=t0 + timedelta(seconds=500))  # $10.00
    assert len(events(renter, "balance.low")) == 1
    funds.charge_and_release(now=t0 + timedelta(seconds=780))  # $4.40
    assert [e.data["balance"] for e in events(renter, "balance.low")] == ["4.00", "4.40"]


def test_low_balance_uses_the_default_threshold_without_a_settings_row(
    admin: User, settings: SettingsWrapper
) -> None:
    settings.NOTIFY_LOW_BALANCE_DEFAULT_MICROS = 8 * UNIT
    renter = _funded(admin, 10 * UNIT)
    t0 = timezone.now()
    _run(_priced_host(), renter, t0)
    funds.charge_and_release(now=t0 + timedelta(seconds=100))  # $9
    assert not events(renter, "balance.low")
    funds.charge_and_release(now=t0 + timedelta(seconds=300))  # $7
    funds.charge_and_release(now=t0 + timedelta(seconds=310))
    assert only(renter, "balance.low")["threshold"] == "8.00"
    # The row is made on first use, with the threshold the notice was judged by.
    row = NotificationSettings.objects.get(user=renter)
    assert row.low_balance_threshold_micros == 8 * UNIT
    assert row.low_balance_notified_at is not None


def test_low_balance_off_tells_nothing(admin: User, settings: SettingsWrapper) -> None:
    off = _funded(admin, 10 * UNIT)
    _threshold(off, None)
    settings.NOTIFY_LOW_BALANCE_DEFAULT_MICROS = 0
    default_off = _funded(admin, 10 * UNIT)
    host = _priced_host(gpus=(0, 1))
    t0 = timezone.now()
    _run(host, off, t0, index=0)
    _run(host, default_off, t0, index=1)
    funds.charge_and_release(now=t0 + timedelta(seconds=900))  # $1 left each
    assert not Event.objects.filter(kind="balance.low").exists()
    assert _notified_at(off) is None
    assert not NotificationSettings.objects.filter(user=default_off).exists()


def test_low_balance_needs_rentals_that_bill(admin: User) -> None:
    """A low balance with nothing running is no news: nothing is about to stop."""
    idle = _funded(admin, 1 * UNIT)
    _threshold(idle, 5 * UNIT)
    free_renter = _funded(admin, 1 * UNIT)
    _threshold(free_renter, 5 * UNIT)
    f.run_lease(f.register_host(), renter=free_renter)  # a $0 GPU
    assert low_balance.review_low_balances() == 0
    assert not Event.objects.filter(kind="balance.low").exists()
