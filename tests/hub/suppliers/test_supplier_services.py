from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from hub.agents import heartbeats, registration, sweep
from hub.leases import services as lease_services
from hub.leases.models import Command, Lease, LeaseGpu
from hub.lib import tokens
from hub.suppliers import liveness, services
from hub.suppliers.models import AgentToken, Gpu, Host, HostTransition
from tests.hub import factories as f

pytestmark = pytest.mark.usefixtures("db")


# --- tokens -------------------------------------------------------------------------------------


def test_created_token_is_well_formed_and_shows_its_prefix() -> None:
    token, plaintext = f.make_token(name="rig")
    assert plaintext.startswith("cgpu_")
    assert tokens.well_formed(plaintext)
    assert token.prefix == plaintext[: tokens.VISIBLE_PREFIX_LEN]
    assert token.name == "rig"


def test_only_the_digest_of_a_token_is_stored() -> None:
    token, plaintext = f.make_token()
    row = AgentToken.objects.filter(pk=token.pk).values().get()
    assert row["digest"] == tokens.digest(plaintext)
    assert not any(plaintext in str(value) for value in row.values())
    # Nor the secret part on its own (the prefix is only its visible start).
    secret = plaintext[tokens.VISIBLE_PREFIX_LEN :]
    assert not any(secret in str(value) for value in row.values())


def test_authenticate_accepts_a_valid_token_and_notes_its_use() -> None:
    token, plaintext = f.make_token()
    assert services.authenticate_agent_token(plaintext) == token
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None
    # Within the resolution a reconnect writes nothing; past it, the time moves on.
    assert services.authenticate_agent_token(plaintext) == token
    token.refresh_from_db()
    assert token.last_used_at == first
    stale = first - services.TOKEN_LAST_USED_RESOLUTION - timedelta(seconds=1)
    AgentToken.objects.filter(pk=token.pk).update(last_used_at=stale)
    services.authenticate_agent_token(plaintext)
    token.refresh_from_db()
    assert token.last_used_at > first


def test_a_batch_of_tokens_costs_two_statements_whatever_its_size() -> None:
    """A reconnect storm's connect-time checks (hub/agents/token_batch.py)."""
    accepted = [f.make_token(f.make_user("supplier")) for _ in range(30)]
    revoked, revoked_plaintext = f.make_token()
    services.revoke_agent_token(revoked.pk)
    plaintexts = [p for _, p in accepted] + [revoked_plaintext, tokens.generate_token(), "x", None]
    plaintexts += plaintexts[:5]  # a token twice in one batch is one row

    with CaptureQueriesContext(connection) as first:
        answer = services.authenticate_agent_tokens(plaintexts)
    assert answer == {tokens.digest(p): token.pk for token, p in accepted}
    assert len(first) == 2  # the select, and one update of every token's last use
    assert AgentToken.objects.filter(last_used_at__isnull=False).count() == 30

    with CaptureQueriesContext(connection) as again:
        assert services.authenticate_agent_tokens(plaintexts) == answer
    assert len(again) == 1  # used a moment ago: nothing to write
    assert services.authenticate_agent_tokens(["nonsense", None]) == {}  # and no query


def test_authenticate_rejects_an_unknown_well_formed_token() -> None:
    f.make_token()
    assert services.authenticate_agent_token(tokens.generate_token()) is None


@pytest.mark.parametrize("made_up", [None, "", "cgpu_short", "bearer-nonsense"])
def test_authenticate_rejects_a_malformed_token(made_up: str | None) -> None:
    f.make_token()
    assert services.authenticate_agent_token(made_up) is None


def test_authenticate_rejects_a_token_with_a_wrong_checksum() -> None:
    _, plaintext = f.make_token()
    last = plaintext[-1]
    tampered = plaintext[:-1] + ("a" if last != "a" else "b")
    assert not tokens.well_formed(tampered)
    assert services.authenticate_agent_token(tampered) is None


def test_authenticate_rejects_a_revoked_token() -> None:
    token, plaintext = f.make_token()
    assert services.revoke_agent_token(token.pk)
    assert services.authenticate_agent_token(plaintext) is None


def test_authenticate_rejects_the_token_of_an_inactive_user() -> None:
    owner = f.make_user("supplier")
    _, plaintext = f.make_token(owner)
    owner.is_active = False
    owner.save(update_fields=["is_active"])
    assert services.authenticate_agent_token(plaintext) is None


def test_revoke_is_idempotent() -> None:
    token, _ = f.make_token()
    assert services.revoke_agent_token(token.pk) is True
    token.refresh_from_db()
    first_revoked_at = token.revoked_at
    assert first_revoked_at is not None

    assert services.revoke_agent_token(token.pk) is False
    token.refresh_from_db()
    assert token.revoked_at == first_revoked_at


# --- registration -------------------------------------------------------------------------------


def test_register_creates_an_online_host_with_a_transition_and_its_gpus() -> None:
    token, _ = f.make_token()
    message = f.register_message(gpus=[0, 1])
    registered = registration.register_host(token.pk, message, "chan-1")

    host = Host.objects.get(pk=registered.host_id)
    assert host.status == Host.Status.ONLINE
    assert host.owner_id == token.owner_id
    assert host.token_id == token.pk
    assert str(host.agent_id) == message.agent_id
    assert host.hostname == message.hostname
    assert host.channel_name == "chan-1"
    assert host.offline_after is not None
    assert host.offline_after > timezone.now()
    transition = HostTransition.objects.get(host=host)
    assert (transition.from_status, transition.to_status) == ("offline", "online")
    gpus = list(host.gpus.order_by("index"))
    assert [(g.index, g.uuid, g.present) for g in gpus] == [
        (0, message.gpus[0].uuid, True),
        (1, message.gpus[1].uuid, True),
    ]
    assert registered.desired_claims == ()


def test_a_second_register_updates_the_host_instead_of_duplicating_it() -> None:
    token, _ = f.make_token()
    agent_id = str(uuid.uuid4())
    first = registration.register_host(token.pk, f.register_message(agent_id, gpus=[0]), "chan-1")
    renamed = f.register_message(agent_id, gpus=[0], hostname="rig-renamed")
    second = registration.register_host(token.pk, renamed, "chan-2")

    assert second.host_id == first.host_id
    assert Host.objects.filter(agent_id=agent_id).count() == 1
    host = Host.objects.get(pk=first.host_id)
    assert host.hostname == "rig-renamed"
    assert host.channel_name == "chan-2"
    assert Gpu.objects.filter(host=host).count() == 1
    # Still online: no second transition.
    assert HostTransition.objects.filter(host=host).count() == 1


def test_a_gpu_no_longer_reported_is_marked_absent() -> None:
    token, _ = f.make_token()
    agent_id = str(uuid.uuid4())
    host = f.register_host(token, agent_id=agent_id, gpus=[0, 1])
    f.register_host(token, agent_id=agent_id, gpus=[0])

    assert dict(host.gpus.values_list("index", "present")) == {0: True, 1: False}


def test_an_agent_id_of_another_supplier_is_refused() -> None:
    agent_id = str(uuid.uuid4())
    host = f.register_host(agent_id=agent_id)
    intruder_token, _ = f.make_token()

    with pytest.raises(registration.RegistrationRefused):
        registration.register_host(intruder_token.pk, f.register_message(agent_id), "chan-x")

    host.refresh_from_db()
    assert host.owner_id != intruder_token.owner_id
    assert host.token_id != intruder_token.pk


def test_register_ends_a_running_lease_the_agent_no_longer_holds() -> None:
    token, _ = f.make_token()
    host = f.register_host(token)
    lease = f.run_lease(host)

    registered = f.register_host(token, agent_id=str(host.agent_id), claims=[])

    lease.refresh_from_db()
    assert lease.state == Lease.State.ENDED
    assert lease.end_reason == Lease.EndReason.HOST_LOST
    assert lease.failure_reason
    assert lease.ended_at is not None
    assert not LeaseGpu.objects.filter(lease=lease, active=True).exists()
    assert registered.pk == host.pk


def test_register_keeps_a_reported_lease_and_clears_its_host_loss() -> None:
    token, _ = f.make_token()
    host = f.register_host(token)
    lease = f.run_lease(host)
    lease_services.note_host_lost(host.pk, timezone.now())
    lease.refresh_from_db()
    assert lease.host_lost_since is not None

    message = f.register_message(str(host.agent_id), claims=[f.claim_of(lease)])
    registered = registration.register_host(token.pk, message, "chan-2")

    assert registered.desired_claims == (str(lease.id),)
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING
    assert lease.host_lost_since is None


def test_a_claim_for_an_unknown_lease_is_not_desired() -> None:
    token, _ = f.make_token()
    host = f.register_host(token)
    stray = f.claim_of(Lease(id=uuid.uuid4(), epoch=1))

    message = f.register_message(str(host.agent_id), claims=[stray])
    registered = registration.register_host(token.pk, message, "chan-2")

    assert registered.desired_claims == ()


def test_a_claim_for_another_hosts_lease_is_not_desired() -> None:
    owner = f.make_user("supplier")
    token, _ = f.make_token(owner)
    other_host = f.register_host(token)
    lease = f.run_lease(other_host)
    host = f.register_host(token)

    message = f.register_message(str(host.agent_id), claims=[f.claim_of(lease)])
    registered = registration.register_host(token.pk, message, "chan-2")

    assert registered.desired_claims == ()
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING


# --- liveness helpers ---


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


def _set_redis_deadline(host_id: int, deadline: datetime) -> None:
    f.set_liveness_deadline(host_id, deadline)
    assert liveness.deadline_of(host_id) == pytest.approx(deadline.timestamp())


def _make_postgres_deadline_stale(host: Host, now: datetime) -> None:
    # No service writes a past deadline: this stands for a host whose last stats write was
    # long ago (register and heartbeats always write a fresh one).
    Host.objects.filter(pk=host.pk).update(offline_after=now - timedelta(seconds=1))


# --- heartbeats ---------------------------------------------------------------------------------


def test_heartbeat_stats_write_gpu_telemetry() -> None:
    host = f.register_host(gpus=[0])
    before = timezone.now()
    message = f.heartbeat(
        [f.gpu_state(0, utilization_pct=87, memory_used_bytes=5 * f.GIB, pids=[4242])]
    )

    heartbeats.write_heartbeat_stats(host.pk, message)

    gpu = host.gpus.get(index=0)
    assert gpu.utilization_pct == 87
    assert gpu.memory_used_bytes == 5 * f.GIB
    assert gpu.processes == [{"pid": 4242, "name": "python", "memory_bytes": f.GIB}]
    assert gpu.stats_updated_at is not None
    assert gpu.stats_updated_at >= before


def test_heartbeat_stats_move_the_hosts_postgres_deadline() -> None:
    host = f.register_host()
    registered_deadline = host.offline_after
    assert registered_deadline is not None

    heartbeats.write_heartbeat_stats(host.pk, f.heartbeat([0]))

    host.refresh_from_db()
    assert host.offline_after is not None
    assert host.offline_after > registered_deadline
    assert host.last_seen_at is not None


def test_heartbeat_stats_bring_an_offline_host_back_online_with_a_transition() -> None:
    host = f.register_host()
    now = timezone.now()
    _set_redis_deadline(host.pk, now - timedelta(seconds=1))
    assert sweep.mark_overdue_hosts_offline(now=now) == [host.pk]

    heartbeats.write_heartbeat_stats(host.pk, f.heartbeat([0]))

    host.refresh_from_db()
    assert host.status == Host.Status.ONLINE
    latest = HostTransition.objects.filter(host=host).order_by("-at", "-pk").first()
    assert latest is not None
    assert (latest.from_status, latest.to_status, latest.reason) == (
        "offline",
        "online",
        "heartbeat (telemetry flush)",
    )


def test_heartbeat_stats_ignore_a_gpu_the_host_never_registered() -> None:
    host = f.register_host(gpus=[0])
    heartbeats.write_heartbeat_stats(host.pk, f.heartbeat([0, 5]))
    assert list(host.gpus.values_list("index", flat=True)) == [0]


def test_identical_telemetry_has_an_identical_signature() -> None:
    gpu = f.gpu_state(0, utilization_pct=40, memory_used_bytes=3 * f.GIB, pids=[1, 2])
    assert heartbeats.telemetry_signature(f.heartbeat([gpu])) == heartbeats.telemetry_signature(
        f.heartbeat([gpu])
    )


def test_a_utilisation_change_within_one_step_keeps_the_signature() -> None:
    low = f.heartbeat([f.gpu_state(0, utilization_pct=26, gpu_uuid="GPU-a")])
    high = f.heartbeat([f.gpu_state(0, utilization_pct=49, gpu_uuid="GPU-a")])
    assert heartbeats.telemetry_signature(low) == heartbeats.telemetry_signature(high)


def test_a_utilisation_step_changes_the_signature() -> None:
    low = f.heartbeat([f.gpu_state(0, utilization_pct=40, gpu_uuid="GPU-a")])
    high = f.heartbeat([f.gpu_state(0, utilization_pct=50, gpu_uuid="GPU-a")])
    assert heartbeats.telemetry_signature(low) != heartbeats.telemetry_signature(high)


def test_a_new_compute_process_changes_the_signature() -> None:
    before = f.heartbeat([f.gpu_state(0, pids=[100], gpu_uuid="GPU-a")])
    after = f.heartbeat([f.gpu_state(0, pids=[100, 200], gpu_uuid="GPU-a")])
    assert heartbeats.telemetry_signature(before) != heartbeats.telemetry_signature(after)


def test_a_memory_step_changes_the_signature() -> None:
    before = f.heartbeat([f.gpu_state(0, memory_used_bytes=0, gpu_uuid="GPU-a")])
    after = f.heartbeat([f.gpu_state(0, memory_used_bytes=1 << 32, gpu_uuid="GPU-a")])
    assert heartbeats.telemetry_signature(before) != heartbeats.telemetry_signature(after)


# --- offline sweep ------------------------------------------------------------------------------


def test_a_host_past_its_redis_deadline_goes_offline() -> None:
    host = f.register_host()
    now = timezone.now()
    assert host.offline_after is not None
    assert host.offline_after > now  # Postgres: still fresh
    _set_redis_deadline(host.pk, now - timedelta(seconds=1))

    went_offline = sweep.mark_overdue_hosts_offline(now=now)

    assert went_offline == [host.pk]
    host.refresh_from_db()
    assert host.status == Host.Status.OFFLINE
    transition = HostTransition.objects.filter(host=host, to_status="offline").get()
    assert transition.from_status == "online"
    assert liveness.deadline_of(host.pk) is None


def test_the_active_leases_of_a_host_that_went_offline_are_marked_lost() -> None:
    host = f.register_host(gpus=[0, 1])
    running = f.run_lease(host, [0])
    reserving = f.start_lease(host, [1])
    now = timezone.now()
    _set_redis_deadline(host.pk, now - timedelta(seconds=1))

    sweep.mark_overdue_hosts_offline(now=now)

    for lease in (running, reserving):
        lease.refresh_from_db()
        assert lease.host_lost_since == now
        assert lease.state in (Lease.State.RUNNING, Lease.State.RESERVING)  # not ended yet


def test_a_fresh_redis_deadline_outranks_a_stale_postgres_one() -> None:
    host = f.register_host()
    now = timezone.now()
    _make_postgres_deadline_stale(host, now)
    _set_redis_deadline(host.pk, now + timedelta(seconds=20))

    went_offline = sweep.mark_overdue_hosts_offline(now=now)

    assert host.pk not in went_offline
    host.refresh_from_db()
    assert host.status == Host.Status.ONLINE
    assert not HostTransition.objects.filter(host=host, to_status="offline").exists()
    assert liveness.deadline_of(host.pk) is not None


def test_a_host_past_its_postgres_deadline_without_redis_entry_goes_offline() -> None:
    host = f.register_host()
    now = timezone.now()
    _make_postgres_deadline_stale(host, now)
    liveness.forget(host.pk)  # as after a Redis restart

    went_offline = sweep.mark_overdue_hosts_offline(now=now)

    assert went_offline == [host.pk]
    host.refresh_from_db()
    assert host.status == Host.Status.OFFLINE


def test_the_offline_sweep_is_a_compare_and_set() -> None:
    host = f.register_host()
    now = timezone.now()
    _set_redis_deadline(host.pk, now - timedelta(seconds=1))
    assert sweep.mark_overdue_hosts_offline(now=now) == [host.pk]

    # A second sweep that still sees the host overdue (a stale Redis entry and a stale
    # Postgres deadline) must not flip it again.
    _make_postgres_deadline_stale(host, now)
    _set_redis_deadline(host.pk, now - timedelta(seconds=1))
    assert sweep.mark_overdue_hosts_offline(now=now) == []

    assert HostTransition.objects.filter(host=host, to_status="offline").count() == 1


def test_an_online_host_within_its_deadline_stays_online() -> None:
    host = f.register_host()
    went_offline = sweep.mark_overdue_hosts_offline(now=timezone.now())
    assert host.pk not in went_offline
    host.refresh_from_db()
    assert host.status == Host.Status.ONLINE


# --- host comes back (bug reports) --------------------------------------------------------------


def test_a_lease_whose_host_came_back_is_not_ended_after_the_grace() -> None:
    """A lease still reserving when its host dropped: the agent never got the reserve, so it
    reports no claim on register; the re-sent reserve then succeeds and the lease runs. The
    host is back, so the grace-period sweep must not end it."""
    token, _ = f.make_token()
    host = f.register_host(token)
    lease = f.start_lease(host)
    now = timezone.now()
    _set_redis_deadline(host.pk, now - timedelta(seconds=1))
    assert sweep.mark_overdue_hosts_offline(now=now) == [host.pk]

    f.register_host(token, agent_id=str(host.agent_id), claims=[])  # back, holding nothing yet
    assert f.ack(f.command_of(lease, Command.Kind.RESERVE))
    assert f.ack(f.command_of(lease, Command.Kind.DOCKER_RUN), result={"container_id": "c1"})
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING

    later = now + timedelta(seconds=settings.LEASE_HOST_GRACE_S + 60)
    assert lease_services.end_leases_of_lost_hosts(now=later) == []
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING
    assert lease.host_lost_since is None
    # It was away before the lease ran: that is not running time, so none of it is taken
    # off the running time that began later (issue 14 item 2).
    assert lease.offline_duration == timedelta(0)


def test_a_lease_whose_host_resumed_heartbeats_is_not_ended_after_the_grace() -> None:
    """The sweep marked the host offline (heartbeats late), then heartbeats resumed on the
    same connection, reporting the lease's claim: the host is online again without a new
    register, and its running lease must survive the grace-period sweep."""
    host = f.register_host()
    lease = f.run_lease(host)
    now = timezone.now()
    _set_redis_deadline(host.pk, now - timedelta(seconds=1))
    assert sweep.mark_overdue_hosts_offline(now=now) == [host.pk]

    heartbeats.write_heartbeat_stats(host.pk, f.heartbeat([0], claims=[f.claim_of(lease)]))
    host.refresh_from_db()
    assert host.status == Host.Status.ONLINE

    later = now + timedelta(seconds=settings.LEASE_HOST_GRACE_S + 60)
    assert lease_services.end_leases_of_lost_hosts(now=later) == []
    lease.refresh_from_db()
    assert lease.state == Lease.State.RUNNING


def test_a_re_register_succeeds_when_the_old_sockets_process_is_gone_and_its_queue_full() -> None:
    # After a web process stops, its channels' shared queue fills with undelivered notices;
    # a storm of re-registrations must not fail on ChannelFull (it stalled one at 10,000).
    layer = get_channel_layer()
    dead = f"specific.gone-{uuid.uuid4().hex}!"
    try:
        with pytest.raises(ChannelFull):  # noqa: PT012 - fill until the layer refuses
            for n in range(10_000):
                async_to_sync(layer.send)(f"{dead}{n}", {"type": "agent.command"})
        token, _ = f.make_token()
        agent_id = str(uuid.uuid4())
        first = f.register_host(token, agent_id=agent_id, channel_name=f"{dead}last")

        again = f.register_host(token, agent_id=agent_id, channel_name="specific.new!1")

        assert again.pk == first.pk
        assert again.channel_name == "specific.new!1"
        assert again.status == Host.Status.ONLINE
        # Revocation tells the old channel too, and is not stopped by the full queue either.
        assert services.revoke_agent_token(token.pk)
    finally:
        client = liveness.sync_client()
        for key in client.scan_iter(match=f"*{dead}*"):
            client.delete(key)


def test_a_token_holds_at_most_max_hosts_per_token(settings: object) -> None:
    settings.MAX_HOSTS_PER_TOKEN = 2  # type: ignore[attr-defined]
    token, _ = f.make_token()
    first = f.register_host(token)
    f.register_host(token)

    with pytest.raises(registration.RegistrationRefused, match="already holds 2 hosts"):
        f.register_host(token)

    # A host it holds may always come back.
    assert f.register_host(token, agent_id=str(first.agent_id)).pk == first.pk
    assert Host.objects.filter(token=token).count() == 2


# --- the sweep after the hub's own outages ------------------------------------------------------


def _previous_sweep(run_id: str, seconds_ago: float) -> None:
    """The mark a sweep left: by this Redis (its run id) or another life of it, some time ago."""
    client = liveness.sync_client()
    client.set(liveness.sweep_mark_key(), f"{run_id} {time.time() - seconds_ago!r}")
    client.delete(liveness.sweep_hold_key())


def _this_redis() -> str:
    return str(liveness.sync_client().info("server")["run_id"])


@pytest.mark.parametrize(
    "before",
    [
        ("another-redis-life", 5.0),  # Redis restarted (e.g. from an old snapshot)
        ("this", 120.0),  # no sweep for two minutes: Redis or beat was down
        None,  # no mark at all: Redis lost its data
    ],
    ids=["restart", "gap", "data-lost"],
)
def test_after_the_hubs_own_outage_no_host_goes_offline_before_its_postgres_deadline(
    before: tuple[str, float] | None,
) -> None:
    host = f.register_host()
    now = timezone.now()
    assert host.offline_after > now  # heartbeats reached Postgres meanwhile
    _set_redis_deadline(host.pk, now - timedelta(seconds=30))  # what the old Redis says
    if before is None:
        liveness.sync_client().delete(liveness.sweep_mark_key())
    else:
        run_id, seconds_ago = before
        _previous_sweep(_this_redis() if run_id == "this" else run_id, seconds_ago)

    assert sweep.mark_overdue_hosts_offline(now=now) == []
    # The next sweeps hold too, for one offline interval.
    assert sweep.mark_overdue_hosts_offline(now=timezone.now()) == []
    host.refresh_from_db()
    assert host.status == Host.Status.ONLINE


def test_during_the_hold_a_host_past_both_deadlines_still_goes_offline() -> None:
    host = f.register_host()
    now = timezone.now()
    _make_postgres_deadline_stale(host, now)
    _set_redis_deadline(host.pk, now - timedelta(seconds=30))
    _previous_sweep("another-redis-life", 5.0)

    assert sweep.mark_overdue_hosts_offline(now=now) == [host.pk]


def test_once_the_hold_is_over_redis_alone_decides_again() -> None:
    host = f.register_host()
    now = timezone.now()
    _set_redis_deadline(host.pk, now - timedelta(seconds=1))
    _previous_sweep("another-redis-life", 5.0)
    assert sweep.mark_overdue_hosts_offline(now=now) == []

    # One offline interval later, with sweeps every few seconds meanwhile: the hold ran out.
    f.mark_sweep_continuous()
    liveness.sync_client().set(liveness.sweep_hold_key(), repr(time.time() - 1))
    assert sweep.mark_overdue_hosts_offline(now=timezone.now()) == [host.pk]
