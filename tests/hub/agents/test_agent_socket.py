"""The agents' WebSocket consumer through Channels' WebsocketCommunicator, on the real Redis
channel layer and the real database."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.accounts.models import User
from hub.agents import consumer, heartbeat_batch, stats, sweep, token_batch, token_cache
from hub.asgi import application
from hub.leases import logs as lease_logs
from hub.lib.tokens import generate_token
from hub.suppliers import liveness, services
from hub.suppliers.models import Gpu, Host, HostTransition
from supplier_agent.protocol import CLOSE_UNSUPPORTED_PROTOCOL, MAX_FRAME_BYTES
from tests.hub import factories as f
from tests.support.batching import busy as _busy
from tests.support.polling import async_wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _register(
    agent_id: str,
    gpus: int = 1,
    claims: list[dict[str, Any]] | None = None,
    machine_id: str | None = None,
) -> str:
    extra = {"machine_id": machine_id} if machine_id is not None else {}
    return json.dumps(
        {
            **extra,
            "type": "register",
            "v": 1,
            "agent_id": agent_id,
            "hostname": "gpu-box-1",
            "os": "Ubuntu 24.04",
            "arch": "x86_64",
            "cpu_model": "EPYC",
            "cpu_count": 32,
            "ram_bytes": 256 * 2**30,
            "agent_version": "0.1.0",
            "runtime": "docker",
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-{i:08x}-0000-4000-8000-{i:012x}",
                    "name": "NVIDIA H100 80GB HBM3",
                    "memory_total_bytes": 80 * 2**30,
                    "memory_used_bytes": 0,
                    "utilization_pct": 0,
                    "processes": [],
                }
                for i in range(gpus)
            ],
            "claims": claims or [],
        }
    )


def _heartbeat(utilization: int = 0) -> str:
    return json.dumps(
        {
            "type": "heartbeat",
            "v": 1,
            "gpus": [
                {
                    "index": 0,
                    "uuid": "GPU-00000000-0000-4000-8000-000000000000",
                    "name": "NVIDIA H100 80GB HBM3",
                    "memory_total_bytes": 80 * 2**30,
                    "memory_used_bytes": 0,
                    "utilization_pct": utilization,
                    "processes": [],
                }
            ],
        }
    )


@database_sync_to_async
def _supplier_token(username: str = "supplier") -> tuple[int, str]:
    owner = User.objects.create_user(username=f"{username}-{uuid.uuid4().hex[:6]}")
    token, plaintext = services.create_agent_token(owner, "test", default_price_per_hour_micros=0)
    # Closed in the call's own context: database_sync_to_async's clean-up runs outside it
    # (asgiref 3.13, hub/agents/db_threads.py) and can leave it open past the session's end.
    connections.close_all()
    return token.pk, plaintext


async def _connect(plaintext: str | None, *, legacy: bool = False) -> WebsocketCommunicator:
    if legacy:
        return WebsocketCommunicator(application, f"/api/p2p/ws/{plaintext}")
    headers = [(b"authorization", f"Bearer {plaintext}".encode())] if plaintext else []
    return WebsocketCommunicator(application, "/api/p2p/ws/", headers=headers)


async def _registered(
    plaintext: str, agent_id: str | None = None
) -> tuple[WebsocketCommunicator, dict[str, Any]]:
    communicator = await _connect(plaintext)
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_to(text_data=_register(agent_id or str(uuid.uuid4())))
    welcome = json.loads(await communicator.receive_from(timeout=10))
    assert welcome["type"] == "welcome", welcome
    return communicator, welcome


@pytest.mark.parametrize(
    "token",
    [None, "nonsense", "cgpu_" + "a" * 36, generate_token()],
    # Named, not shown: a generated token differs in each xdist worker's collection.
    ids=["missing", "nonsense", "unknown", "generated"],
)
async def test_a_bad_token_is_refused_before_anything_changes(token: str | None) -> None:
    communicator = await _connect(token)
    connected, _ = await communicator.connect()
    assert not connected
    assert await database_sync_to_async(Host.objects.count)() == 0


async def test_a_revoked_token_is_refused() -> None:
    token_id, plaintext = await _supplier_token()
    await database_sync_to_async(services.revoke_agent_token)(token_id)
    connected, _ = await (await _connect(plaintext)).connect()
    assert not connected


@pytest.mark.parametrize("legacy", [False, True])
async def test_register_brings_the_host_online_with_its_gpus(legacy: bool) -> None:
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    communicator = await _connect(plaintext, legacy=legacy)
    assert (await communicator.connect())[0]
    await communicator.send_to(text_data=_register(agent_id, gpus=2))
    welcome = json.loads(await communicator.receive_from(timeout=10))
    host = await database_sync_to_async(Host.objects.get)(agent_id=agent_id)
    assert welcome == {
        "type": "welcome",
        "v": 1,
        "host_id": str(host.pk),
        "heartbeat_interval_s": 15,
        "desired_claims": [],
        "prepull_images": [],
    }
    assert host.status == Host.Status.ONLINE
    assert host.channel_name
    assert await database_sync_to_async(Gpu.objects.filter(host=host).count)() == 2
    assert (
        await database_sync_to_async(
            HostTransition.objects.filter(host=host, to_status="online").count
        )()
        == 1
    )
    await communicator.disconnect()
    await database_sync_to_async(host.refresh_from_db)()
    assert host.channel_name == ""
    liveness.forget(host.pk)


async def test_heartbeats_move_liveness_in_redis_and_queue_telemetry_only_on_change() -> None:
    _, plaintext = await _supplier_token()
    with f.private_pending_hash():
        communicator, welcome = await _registered(plaintext)
        host_id = int(welcome["host_id"])
        before = liveness.deadline_of(host_id)
        gpu = await database_sync_to_async(Gpu.objects.get)(host_id=host_id, index=0)

        await communicator.send_to(text_data=_heartbeat(utilization=40))
        await _round_trip(communicator)
        assert liveness.deadline_of(host_id) > before
        assert await database_sync_to_async(stats.flush_pending)() == 1
        await database_sync_to_async(gpu.refresh_from_db)()
        assert gpu.utilization_pct == 40
        written = gpu.stats_updated_at

        await communicator.send_to(text_data=_heartbeat(utilization=41))  # same 25% step
        await _round_trip(communicator)
        assert heartbeat_batch.take_pending() == {}
        await database_sync_to_async(gpu.refresh_from_db)()
        assert gpu.stats_updated_at == written
        assert gpu.utilization_pct == 40
        await communicator.disconnect()
    liveness.forget(host_id)


async def _round_trip(communicator: WebsocketCommunicator) -> list[dict[str, Any]]:
    """Messages on one socket are handled in order: once the error reply to a unique probe
    arrives, everything sent before it has been processed. Returns the replies before it."""
    marker = f"probe-{uuid.uuid4().hex}"
    await communicator.send_to(text_data=json.dumps({"type": marker, "v": 1}))
    replies = []
    while True:
        reply = json.loads(await communicator.receive_from(timeout=10))
        if reply.get("reason") == f"unknown message type {marker!r}":
            return replies
        replies.append(reply)


async def test_messages_before_register_get_an_error() -> None:
    _, plaintext = await _supplier_token()
    communicator = await _connect(plaintext)
    assert (await communicator.connect())[0]
    await communicator.send_to(text_data=_heartbeat())
    reply = json.loads(await communicator.receive_from(timeout=10))
    assert reply == {"type": "error", "v": 1, "reason": "register first", "ref": "heartbeat"}
    await communicator.disconnect()


async def test_revoking_the_token_closes_its_live_socket_within_5_s() -> None:
    token_id, plaintext = await _supplier_token()
    communicator, welcome = await _registered(plaintext)
    await database_sync_to_async(services.revoke_agent_token)(token_id)
    output = await communicator.receive_output(timeout=5)
    assert output == {"type": "websocket.close", "code": 4403}
    await communicator.disconnect()
    liveness.forget(int(welcome["host_id"]))


async def test_a_socket_that_registers_after_its_token_was_revoked_is_refused() -> None:
    token_id, plaintext = await _supplier_token()
    communicator = await _connect(plaintext)
    connected, _ = await communicator.connect()
    assert connected
    await database_sync_to_async(services.revoke_agent_token)(token_id)

    await communicator.send_to(text_data=_register(str(uuid.uuid4())))
    reply = json.loads(await communicator.receive_from(timeout=5))
    assert reply["type"] == "error"
    assert reply["reason"] == "this agent token was revoked"
    assert (await communicator.receive_output(timeout=5))["type"] == "websocket.close"
    assert not await Host.objects.filter(token_id=token_id).aexists()
    await communicator.disconnect()


def _token_batches() -> int:
    """Connect-time token checks this loop sent to the database, in batches (token_batch)."""
    return token_batch.batchers.get().batches


async def test_a_token_accepted_a_moment_ago_costs_the_next_socket_no_query() -> None:
    _, plaintext = await _supplier_token()
    before = _token_batches()
    first, _ = await _registered(plaintext)
    second, welcome = await _registered(plaintext)
    assert _token_batches() == before + 1
    await first.disconnect()
    await second.disconnect()
    liveness.forget(int(welcome["host_id"]))


async def test_a_made_up_token_costs_no_query() -> None:
    before = _token_batches()
    communicator = await _connect(generate_token())  # well formed, in no row
    assert (await communicator.connect())[0] is False
    assert _token_batches() == before + 1
    for nonsense in ("cgpu_" + "a" * 36, "nonsense"):
        assert (await (await _connect(nonsense)).connect())[0] is False
    assert _token_batches() == before + 1


def _storm_tokens() -> tuple[list[str], dict[str, int]]:
    """Tokens a storm brings: one shared by 4 hosts, 3 of one host each (accepted); a revoked
    one, one of a supplier no longer active, one in no row (refused). And the ids accepted."""
    ids = {}
    for _ in range(4):
        owner = f.make_user("supplier")
        token, plaintext = f.make_token(owner)
        ids[plaintext] = token.pk
    shared, *own = ids
    revoked_token, revoked = f.make_token()
    services.revoke_agent_token(revoked_token.pk)
    inactive = f.make_user("supplier")
    _, of_inactive = f.make_token(inactive)
    inactive.is_active = False
    inactive.save(update_fields=["is_active"])
    connections.close_all()  # as in _supplier_token
    return [shared] * 4 + own + [revoked, of_inactive, generate_token()], ids


async def test_sockets_arriving_together_are_checked_in_one_batch() -> None:
    """A storm's handshakes: each socket its own answer, all of them one query."""
    wanted, ids = await database_sync_to_async(_storm_tokens)()
    batcher = token_batch.batchers.get()
    before = batcher.batches
    communicators = [await _connect(plaintext) for plaintext in wanted]
    async with _busy(batcher):
        connecting = [asyncio.ensure_future(c.connect()) for c in communicators]
        await async_wait_for(
            lambda: batcher.waiting == len(wanted), timeout_s=10, what="every check queued"
        )
    answers = [connected for connected, _ in await asyncio.gather(*connecting)]

    assert answers == [True] * 7 + [False] * 3
    assert batcher.batches == before + 1
    for communicator in communicators[:7]:
        await communicator.disconnect()
    # Each accepted socket's token is cached with its own id.
    assert {p: token_cache.accepted.lookup(p) for p in ids} == ids


async def test_a_revoked_token_is_refused_at_register_when_the_connect_check_was_cached() -> None:
    token_id, plaintext = await _supplier_token()
    before = _token_batches()
    first = await _connect(plaintext)
    assert (await first.connect())[0]
    await first.disconnect()
    # No registered socket: nothing in this process hears of the revocation.
    await database_sync_to_async(services.revoke_agent_token)(token_id)

    second = await _connect(plaintext)
    assert (await second.connect())[0]  # from the cache: the database would have said 403
    assert _token_batches() == before + 1
    await second.send_to(text_data=_register(str(uuid.uuid4())))
    reply = json.loads(await second.receive_from(timeout=5))
    assert reply["type"] == "error"
    assert reply["reason"] == "this agent token was revoked"
    assert (await second.receive_output(timeout=5))["type"] == "websocket.close"
    assert not await Host.objects.filter(token_id=token_id).aexists()
    await second.disconnect()
    # The refusal dropped it from the cache: the next socket is refused at the handshake.
    assert not (await (await _connect(plaintext)).connect())[0]
    assert _token_batches() == before + 2


async def test_a_probe_with_a_revoked_token_is_refused_when_the_connect_check_was_cached() -> None:
    token_id, plaintext = await _supplier_token()
    _, welcome_of_first = await _registered(plaintext)
    first_host = welcome_of_first["host_id"]
    probe = await _connect(plaintext)
    assert (await probe.connect())[0]
    await database_sync_to_async(services.revoke_agent_token)(token_id)
    register = json.loads(_register(str(uuid.uuid4())))
    await probe.send_to(text_data=json.dumps({**register, "probe": True}))
    reply = json.loads(await probe.receive_from(timeout=5))
    assert reply == {
        "type": "error",
        "v": 1,
        "reason": "this agent token was revoked",
        "ref": "register",
    }
    await probe.disconnect()
    liveness.forget(int(first_host))


async def test_revocation_through_a_registered_socket_empties_the_cache_for_new_sockets() -> None:
    token_id, plaintext = await _supplier_token()
    before = _token_batches()
    communicator, welcome = await _registered(plaintext)
    await database_sync_to_async(services.revoke_agent_token)(token_id)
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}
    await communicator.disconnect()
    assert not (await (await _connect(plaintext)).connect())[0]  # 403, not a cached accept
    assert _token_batches() == before + 2
    liveness.forget(int(welcome["host_id"]))


frames = st.one_of(
    st.text(min_size=1, max_size=200),
    st.binary(min_size=1, max_size=200).map(lambda b: b.decode("latin-1")),
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.floats(allow_nan=False)
        | st.text(max_size=20),
        lambda children: st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=10), children, max_size=4),
        max_leaves=12,
    ).map(json.dumps),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["register", "heartbeat", "ack", "container_exited", "pong"]),
            "v": st.sampled_from([1, 1, 2, "1", None]),
        },
        optional={
            "command_id": st.one_of(st.uuids().map(str), st.integers(), st.text(max_size=5)),
            "ok": st.one_of(st.booleans(), st.integers()),
            "gpus": st.one_of(st.lists(st.integers(), max_size=3), st.text(max_size=5)),
            "agent_id": st.one_of(st.uuids().map(str), st.none()),
            "lease_id": st.uuids().map(str),
            "exit_code": st.integers(),
        },
    ).map(json.dumps),
)


def _speaks_another_protocol(frame: str) -> bool:
    try:
        data = json.loads(frame)
    except ValueError:
        return False
    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        return False
    version = data.get("v")
    return type(version) is not int or version != 1


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(frame=frames)
async def test_malformed_frames_get_an_error_reply_and_the_socket_goes_on(frame: str) -> None:
    _, plaintext = await _supplier_token()
    communicator, welcome = await _registered(plaintext)
    await communicator.send_to(text_data=frame)
    if _speaks_another_protocol(frame):
        # Not a v1 agent at all: one error saying what this hub speaks, then the close.
        reply = json.loads(await communicator.receive_from(timeout=10))
        assert "protocol v1" in reply["reason"]
        closed = await communicator.receive_output(timeout=10)
        assert closed == {"type": "websocket.close", "code": CLOSE_UNSUPPORTED_PROTOCOL}
        await communicator.disconnect()
        liveness.forget(int(welcome["host_id"]))
        return
    # At most one reply, an error (a frame that happens to be valid, like a bare heartbeat,
    # gets none); then the socket still works.
    replies = await _round_trip(communicator)
    assert len(replies) <= 1
    assert all(reply["type"] == "error" for reply in replies)
    await communicator.send_to(text_data=_heartbeat())
    assert await _round_trip(communicator) == []
    await communicator.disconnect()
    liveness.forget(int(welcome["host_id"]))


async def test_huge_and_binary_frames_are_refused_and_the_socket_goes_on() -> None:
    _, plaintext = await _supplier_token()
    communicator, welcome = await _registered(plaintext)
    huge = json.dumps({"type": "pong", "v": 1, "nonce": "x" * (MAX_FRAME_BYTES + 1)})
    await communicator.send_to(text_data=huge)
    assert "larger than" in json.loads(await communicator.receive_from(timeout=10))["reason"]
    await communicator.send_to(bytes_data=b"\x00\x01")
    assert "binary" in json.loads(await communicator.receive_from(timeout=10))["reason"]
    await communicator.send_to(text_data='{"type": "pong", "v": 1, "nonce": ' + "9" * 5000 + "}")
    assert "not valid JSON" in json.loads(await communicator.receive_from(timeout=10))["reason"]
    assert await _round_trip(communicator) == []
    await communicator.disconnect()
    liveness.forget(int(welcome["host_id"]))


async def test_a_newer_connection_for_the_same_agent_closes_the_older_one() -> None:
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    older, welcome = await _registered(plaintext, agent_id)
    newer, _ = await _registered(plaintext, agent_id)
    assert await older.receive_output(timeout=5) == {"type": "websocket.close", "code": 4409}
    host = await database_sync_to_async(Host.objects.get)(agent_id=agent_id)
    assert host.channel_name  # the newer socket's, untouched by the older one's disconnect
    await older.disconnect()
    await database_sync_to_async(host.refresh_from_db)()
    assert host.channel_name
    await newer.disconnect()
    liveness.forget(int(welcome["host_id"]))


async def test_a_flooding_agent_is_disconnected() -> None:
    _, plaintext = await _supplier_token()
    communicator, welcome = await _registered(plaintext)
    for _ in range(consumer.MAX_FRAMES_PER_WINDOW):
        await communicator.send_to(text_data='{"type": "pong", "v": 1, "nonce": "n"}')
    closed = None
    while closed is None:
        output = await communicator.receive_output(timeout=10)
        if output["type"] == "websocket.close":
            closed = output
    assert closed["code"] == consumer.CLOSE_TOO_MANY_FRAMES
    await communicator.disconnect()  # lets the consumer finish its own disconnect handler
    liveness.forget(int(welcome["host_id"]))


async def test_a_socket_that_never_registers_is_closed(settings: Any) -> None:
    settings.AGENT_REGISTER_TIMEOUT_S = 1
    _, plaintext = await _supplier_token()
    communicator = await _connect(plaintext)
    assert (await communicator.connect())[0]
    output = await communicator.receive_output(timeout=10)
    assert output == {"type": "websocket.close", "code": consumer.CLOSE_NO_REGISTER}
    await communicator.disconnect()


def _chunk(lease_id: str, seq: int, data: str) -> str:
    return json.dumps({"type": "log_chunk", "v": 1, "lease_id": lease_id, "seq": seq, "data": data})


async def test_log_chunks_of_its_own_lease_reach_the_followers_and_the_backlog() -> None:
    _, plaintext = await _supplier_token()
    communicator, welcome = await _registered(plaintext)
    host_id = int(welcome["host_id"])
    lease = await database_sync_to_async(f.start_lease)(await Host.objects.aget(pk=host_id))
    other_host = await database_sync_to_async(f.register_host)()
    other_lease = await database_sync_to_async(f.start_lease)(other_host)
    layer = get_channel_layer()
    follower = await layer.new_channel()
    await layer.group_add(lease_logs.group_name(str(lease.pk)), follower)
    await layer.group_add(lease_logs.group_name(str(other_lease.pk)), follower)
    try:
        await communicator.send_to(text_data=_chunk(str(other_lease.pk), 1, "not yours\n"))
        await communicator.send_to(text_data=_chunk(str(other_lease.pk), 2, "still not\n"))
        await communicator.send_to(text_data=_chunk(str(lease.pk), 7, "hello\n"))
        # Refused once per lease with a reason; the later chunk of that lease is dropped quietly.
        assert await _round_trip(communicator) == [
            {
                "type": "error",
                "v": 1,
                "reason": f"lease {other_lease.pk} is not on this host",
                "ref": "log_chunk",
            }
        ]
        event = await asyncio.wait_for(layer.receive(follower), timeout=5)
        assert event == {
            "type": "lease.log",
            "lease_id": str(lease.pk),
            "seq": 7,
            "data": "hello\n",
        }
        assert await lease_logs.backlog(str(lease.pk)) == [{"seq": 7, "data": "hello\n"}]
        assert await lease_logs.backlog(str(other_lease.pk)) == []
        # Output is not frames: many chunks do not trip the flood limit.
        for seq in range(8, 8 + consumer.MAX_FRAMES_PER_WINDOW + 50):
            await communicator.send_to(text_data=_chunk(str(lease.pk), seq, f"{seq}\n"))
        assert await _round_trip(communicator) == []
        kept = await lease_logs.backlog(str(lease.pk))
        assert len(kept) == lease_logs.BACKLOG_CHUNKS
        assert kept[-1]["seq"] == 7 + consumer.MAX_FRAMES_PER_WINDOW + 50
    finally:
        await layer.group_discard(lease_logs.group_name(str(lease.pk)), follower)
        await layer.group_discard(lease_logs.group_name(str(other_lease.pk)), follower)
        liveness.sync_client().delete(lease_logs.backlog_key(str(lease.pk)))
        await communicator.disconnect()
        liveness.forget(host_id)
        liveness.forget(other_host.pk)


async def test_a_lease_notice_reaches_its_leases_warnings_and_no_other_hosts() -> None:
    _, plaintext = await _supplier_token()
    communicator, welcome = await _registered(plaintext)
    host_id = int(welcome["host_id"])
    lease = await database_sync_to_async(f.run_lease)(await Host.objects.aget(pk=host_id))
    other_host = await database_sync_to_async(f.register_host)()
    other_lease = await database_sync_to_async(f.run_lease)(other_host)
    text = "This rental has written 45 GiB of its 50 GiB disk allowance."
    try:
        for lease_id in (lease.pk, lease.pk, other_lease.pk):
            await communicator.send_to(
                text_data=json.dumps(
                    {"type": "lease_notice", "v": 1, "lease_id": str(lease_id), "text": text}
                )
            )
        # Taken without a reply, once, and only for this host's own lease.
        assert await _round_trip(communicator) == []
        await lease.arefresh_from_db()
        await other_lease.arefresh_from_db()
        assert lease.warnings == [text]
        assert other_lease.warnings == []
    finally:
        await communicator.disconnect()
        liveness.forget(host_id)
        liveness.forget(other_host.pk)


async def test_an_agent_of_another_protocol_gets_one_error_and_a_close_it_can_log() -> None:
    # The seed's Go agent: its own message shapes, no "v".
    _, plaintext = await _supplier_token()
    communicator = await _connect(plaintext)
    assert (await communicator.connect())[0]
    await communicator.send_to(
        text_data=json.dumps({"type": "register", "machine_id": "m1", "gpus": [{"idx": 0}]})
    )

    reply = json.loads(await communicator.receive_from(timeout=10))
    assert reply["type"] == "error"
    assert "unsupported protocol version None" in reply["reason"]
    assert 'CloudGPU agent protocol v1 (JSON text frames with "v": 1)' in reply["reason"]
    assert "/install.sh" in reply["reason"]
    closed = await communicator.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": CLOSE_UNSUPPORTED_PROTOCOL}
    await communicator.disconnect()


async def test_after_a_flood_close_buffered_frames_cost_nothing(caplog: Any) -> None:
    _, plaintext = await _supplier_token()
    communicator, welcome = await _registered(plaintext)
    for _ in range(consumer.MAX_FRAMES_PER_WINDOW + 500):
        await communicator.send_to(text_data='{"type": "nope", "v": 1}')
    outputs = []
    while True:
        output = await communicator.receive_output(timeout=10)
        outputs.append(output)
        if output["type"] == "websocket.close":
            break
    # The frames after the limit got no error replies (no work), and the close was logged once.
    assert await communicator.receive_nothing(timeout=1)
    errors = [o for o in outputs if o["type"] == "websocket.send"]
    assert len(errors) == consumer.MAX_FRAMES_PER_WINDOW - 1  # the register was one
    floods = [r for r in caplog.records if "sends too many frames" in r.getMessage()]
    assert len(floods) == 1
    await communicator.disconnect()
    liveness.forget(int(welcome["host_id"]))


async def test_log_chunks_for_made_up_leases_cost_a_bounded_number_of_queries() -> None:
    _, plaintext = await _supplier_token()
    communicator, welcome = await _registered(plaintext)
    for seq in range(200):
        chunk = {"type": "log_chunk", "v": 1, "lease_id": str(uuid.uuid4()), "seq": seq}
        await communicator.send_to(text_data=json.dumps({**chunk, "data": "x"}))

    replies = await _round_trip(communicator)

    # Each looked-up lease is answered "not on this host"; the rest were dropped unlooked.
    refused = [r for r in replies if r.get("ref") == "log_chunk"]
    assert len(refused) == consumer.MAX_LOG_LOOKUPS_PER_WINDOW
    await communicator.disconnect()
    liveness.forget(int(welcome["host_id"]))


MACHINE_A, MACHINE_B = "a" * 32, "b" * 32


async def _register_on(
    plaintext: str, agent_id: str, machine_id: str | None
) -> tuple[WebsocketCommunicator, dict[str, Any]]:
    communicator = await _connect(plaintext)
    assert (await communicator.connect())[0]
    await communicator.send_to(text_data=_register(agent_id, machine_id=machine_id))
    return communicator, json.loads(await communicator.receive_from(timeout=10))


async def test_another_token_cannot_take_over_a_live_agent_id() -> None:
    owner_token_id, first = await _supplier_token("owner")
    owner = await database_sync_to_async(
        lambda: services.AgentToken.objects.get(pk=owner_token_id).owner
    )()
    second = (
        await database_sync_to_async(services.create_agent_token)(
            owner, "second", default_price_per_hour_micros=0
        )
    )[1]
    agent_id = str(uuid.uuid4())
    holder, welcome = await _register_on(first, agent_id, MACHINE_A)
    assert welcome["type"] == "welcome"

    taker, refusal = await _register_on(second, agent_id, MACHINE_A)

    assert refusal["type"] == "error"
    assert "agent id in use on another machine with another token" in refusal["reason"]
    assert "state folder copied" in refusal["reason"]
    assert (await taker.receive_output(timeout=5))["type"] == "websocket.close"
    assert await holder.receive_nothing(timeout=1)  # not superseded
    host = await database_sync_to_async(Host.objects.get)(agent_id=agent_id)
    assert host.token_id == owner_token_id
    await holder.disconnect()
    liveness.forget(int(welcome["host_id"]))


async def test_a_copied_state_folder_on_another_machine_is_refused_while_the_holder_is_live() -> (
    None
):
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    holder, welcome = await _register_on(plaintext, agent_id, MACHINE_A)

    copy, refusal = await _register_on(plaintext, agent_id, MACHINE_B)

    assert "agent id in use on another machine" in refusal["reason"]
    # The same machine reconnecting is not a takeover: it supersedes its own older socket.
    again, welcome_again = await _register_on(plaintext, agent_id, MACHINE_A)
    assert welcome_again["type"] == "welcome"
    assert (await holder.receive_output(timeout=5))["code"] == consumer.CLOSE_SUPERSEDED
    for communicator in (holder, copy, again):
        await communicator.disconnect()
    liveness.forget(int(welcome["host_id"]))


async def test_another_machine_never_ends_the_rentals_of_the_machine_that_runs_them() -> None:
    _, plaintext = await _supplier_token()
    agent_id = str(uuid.uuid4())
    holder, welcome = await _register_on(plaintext, agent_id, MACHINE_A)
    host = await database_sync_to_async(Host.objects.get)(agent_id=agent_id)
    lease = await database_sync_to_async(f.run_lease)(host)
    await holder.disconnect()  # the holder's link drops; its rental runs on

    other, refusal = await _register_on(plaintext, agent_id, MACHINE_B)

    assert "whose rentals are still active" in refusal["reason"]
    await database_sync_to_async(lease.refresh_from_db)()
    assert lease.state == "running"
    await other.disconnect()
    liveness.forget(int(welcome["host_id"]))


@pytest.mark.parametrize(
    "path",
    [
        "/api/p2p/ws/../../admin/",
        "/api/p2p/ws/" + "a" * 10_000,
        "/api/p2p/ws/%00",
        "/api/p2p/ws/\x00/",
        "/no/such/socket/",
    ],
    ids=["dotdot", "10kb-token", "percent-00", "nul", "unknown"],
)
async def test_unknown_socket_paths_are_refused_at_the_handshake(path: str) -> None:
    communicator = WebsocketCommunicator(application, path)

    connected, _ = await communicator.connect(timeout=5)

    assert not connected
    await communicator.disconnect()


async def test_a_host_marked_offline_comes_back_on_its_next_heartbeat_not_the_next_flush() -> None:
    """Issue 15 item 1: a stalled socket the sweep gave up on is online again on the first
    heartbeat after, with its transition row, without waiting for the telemetry flush."""
    _, plaintext = await _supplier_token()
    with f.private_liveness_set(), f.private_pending_hash():
        communicator, welcome = await _registered(plaintext)
        host_id = int(welcome["host_id"])
        now = timezone.now()
        await database_sync_to_async(f.set_liveness_deadline)(host_id, now - timedelta(seconds=1))
        went = await database_sync_to_async(sweep.mark_overdue_hosts_offline)(now=now)
        assert went == [host_id]
        host = await database_sync_to_async(Host.objects.get)(pk=host_id)
        assert host.status == Host.Status.OFFLINE

        async def back() -> bool:
            await communicator.send_to(text_data=_heartbeat(utilization=10))
            await _round_trip(communicator)
            row = await database_sync_to_async(Host.objects.get)(pk=host_id)
            return row.status == Host.Status.ONLINE

        # The sweep's word reaches the socket through the channel layer: poll, never flush.
        deadline = time.monotonic() + 10
        while not await back():
            assert time.monotonic() < deadline, "the heartbeat did not bring the host back"
        assert heartbeat_batch.take_pending() != {}  # the flush never ran
        reasons = await database_sync_to_async(
            lambda: list(
                HostTransition.objects.filter(host_id=host_id)
                .order_by("at", "pk")
                .values_list("to_status", "reason")
            )
        )()
        assert reasons[-1] == ("online", "heartbeat")
        await communicator.disconnect()
    liveness.forget(host_id)


async def test_the_hub_times_a_ping_to_the_agent_and_keeps_the_round_trip(settings: Any) -> None:
    """Issue 20 item 3: the round trip on offers is the hub's own measure (ping, pong), taken
    with a heartbeat once the agent has settled in; a pong that is not ours changes nothing."""
    settings.AGENT_RTT_FIRST_PING_S = 0
    settings.AGENT_RTT_FIRST_PING_SPREAD_S = 0
    _, plaintext = await _supplier_token()
    with f.private_pending_hash():
        communicator, welcome = await _registered(plaintext)
        host_id = int(welcome["host_id"])
        await communicator.send_to(text_data=json.dumps({"type": "pong", "v": 1, "nonce": "x"}))
        await communicator.send_to(text_data=_heartbeat())
        pings = [r for r in await _round_trip(communicator) if r["type"] == "ping"]
        assert len(pings) == 1
        host = await database_sync_to_async(Host.objects.get)(pk=host_id)
        assert host.rtt_ms is None  # the stray pong before it was not taken as an answer
        await communicator.send_to(
            text_data=json.dumps({"type": "pong", "v": 1, "nonce": pings[0]["nonce"]})
        )
        await _round_trip(communicator)
        # The figure waits in Redis for the telemetry flush (many hosts per statement), not a
        # row write of its own from the socket.
        await database_sync_to_async(host.refresh_from_db)()
        assert host.rtt_ms is None
        waiting = await database_sync_to_async(heartbeat_batch.take_rtts)()
        assert set(waiting) == {host_id}
        await database_sync_to_async(heartbeat_batch.give_back_rtts)(waiting)
        await database_sync_to_async(stats.flush_pending)()
        await database_sync_to_async(host.refresh_from_db)()
        assert host.rtt_ms == waiting[host_id]
        assert host.rtt_ms >= 0
        # The next ping waits AGENT_RTT_PING_INTERVAL_S: a heartbeat now sends none.
        await communicator.send_to(text_data=_heartbeat())
        assert [r for r in await _round_trip(communicator) if r["type"] == "ping"] == []
        await communicator.disconnect()
    liveness.forget(host_id)
