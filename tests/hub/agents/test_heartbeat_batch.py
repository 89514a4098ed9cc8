"""Heartbeats' batched writes: the group commit into Redis and the flush into Postgres, on the
real Redis and the real database."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.db import IntegrityError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from hub.agents import heartbeat_batch, stats
from hub.suppliers import liveness
from hub.suppliers.models import Gpu, GpuSample, Host
from supplier_agent.protocol import GpuProcess, encode
from tests.hub import factories as f

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _private_keys() -> Iterator[None]:
    with f.private_liveness_set(), f.private_pending_hash():
        yield


class ZaddCounter(threading.Thread):
    """Counts the ZADDs on one key through Redis MONITOR: exact whatever else uses Redis."""

    def __init__(self, key: str) -> None:
        super().__init__(daemon=True)
        self.key = key
        self.sentinel = f"end-{uuid.uuid4().hex}"
        self.count = 0
        self.watching = threading.Event()

    def run(self) -> None:
        client = redis.Redis.from_url(settings.REDIS_URL)
        with client.monitor() as monitor:
            self.watching.set()
            for event in monitor.listen():
                command = event["command"]
                if command.startswith(f"ZADD {self.key} "):
                    self.count += 1
                elif command == f"ECHO {self.sentinel}":
                    break
        client.close()

    def stop(self) -> int:
        liveness.sync_client().echo(self.sentinel)
        self.join(timeout=10)
        assert not self.is_alive()
        return self.count


async def test_concurrent_heartbeats_share_their_redis_writes() -> None:
    hosts = range(1, 201)
    deadline = time.time() + 45
    counter = ZaddCounter(liveness.liveness_key())
    counter.start()
    assert counter.watching.wait(timeout=10)

    await asyncio.gather(
        *(
            heartbeat_batch.record(host, deadline + host, f"telemetry-{host}" if host % 2 else None)
            for host in hosts
        )
    )
    calls = counter.stop()

    # Every heartbeat is in Redis once its call returns...
    for host in hosts:
        assert liveness.deadline_of(host) == pytest.approx(deadline + host)
    pending = liveness.sync_client().hgetall(heartbeat_batch.pending_key())
    assert {int(k): v.decode() for k, v in pending.items()} == {
        host: f"telemetry-{host}" for host in hosts if host % 2
    }
    # ...and 200 of them cost a few pipelines, not 200 writes.
    assert 1 <= calls <= 10


async def test_a_write_redis_refuses_fails_its_heartbeats_and_the_next_write_goes_through() -> None:
    # An error reply (here WRONGTYPE: the liveness key is not a sorted set) reaches every
    # heartbeat of that pipeline as RedisError, the socket's cue to write Postgres instead;
    # the pool's connection, with a reply possibly unread, is not handed on half-read.
    client = liveness.sync_client()
    client.set(liveness.liveness_key(), "not a sorted set")
    results = await asyncio.gather(
        *(heartbeat_batch.record(host, time.time() + 45, "entry") for host in (1, 2, 3)),
        return_exceptions=True,
    )
    assert all(isinstance(r, redis.exceptions.ResponseError) for r in results), results
    assert "WRONGTYPE" in str(results[0])

    client.delete(liveness.liveness_key())
    await heartbeat_batch.record(4, time.time() + 45, "later")
    assert liveness.deadline_of(4) is not None
    assert client.hget(heartbeat_batch.pending_key(), "4") == b"later"


def test_a_batch_of_hosts_is_written_in_a_few_statements() -> None:
    hosts = [f.register_host(gpus=[0, 1]) for _ in range(30)]
    at = timezone.now()
    items = [
        stats.HostStats(
            host_id=host.pk,
            at=at,
            message=f.heartbeat(
                [
                    f.gpu_state(0, utilization_pct=n, memory_used_bytes=n * f.GIB, pids=[n + 1]),
                    f.gpu_state(1, utilization_pct=100 - n),
                ]
            ),
        )
        for n, host in enumerate(hosts)
    ]

    with CaptureQueriesContext(connection) as queries:
        stats.write(items)

    # Hosts, GPUs, samples, pruning (plus the transaction): not a handful per host.
    assert len(queries.captured_queries) <= 6
    for n, host in enumerate(hosts):
        host.refresh_from_db()
        assert host.last_seen_at == at
        gpus = {gpu.index: gpu for gpu in Gpu.objects.filter(host=host)}
        assert gpus[0].utilization_pct == n
        assert gpus[0].memory_used_bytes == n * f.GIB
        assert gpus[0].processes == [{"pid": n + 1, "name": "python", "memory_bytes": f.GIB}]
        assert gpus[1].utilization_pct == 100 - n
        assert gpus[0].stats_updated_at == at
    assert GpuSample.objects.filter(gpu__host__in=hosts, at=at).count() == 60


def test_an_older_entry_never_overwrites_a_newer_one() -> None:
    host = f.register_host(gpus=[0])
    now = timezone.now()
    stats.write([stats.HostStats(host.pk, now, f.heartbeat([f.gpu_state(0, utilization_pct=70)]))])
    older = now - timedelta(seconds=30)
    stats.write(
        [stats.HostStats(host.pk, older, f.heartbeat([f.gpu_state(0, utilization_pct=10)]))]
    )

    gpu = Gpu.objects.get(host=host, index=0)
    assert gpu.utilization_pct == 70
    assert gpu.stats_updated_at == now
    assert Host.objects.get(pk=host.pk).last_seen_at == now


def test_the_newest_entry_per_host_wins_within_a_batch() -> None:
    host = f.register_host(gpus=[0])
    now = timezone.now()
    stats.write(
        [
            stats.HostStats(host.pk, now, f.heartbeat([f.gpu_state(0, utilization_pct=55)])),
            stats.HostStats(host.pk, now - timedelta(seconds=15), f.heartbeat([f.gpu_state(0)])),
        ]
    )
    assert Gpu.objects.get(host=host, index=0).utilization_pct == 55


def test_the_flush_moves_pending_telemetry_to_postgres_and_drops_unreadable_entries() -> None:
    good = f.register_host(gpus=[0])
    bad = f.register_host(gpus=[0])
    bad_written = Gpu.objects.get(host=bad, index=0).stats_updated_at
    message = f.heartbeat([f.gpu_state(0, utilization_pct=91, memory_used_bytes=7 * f.GIB)])
    client = liveness.sync_client()
    client.hset(
        heartbeat_batch.pending_key(),
        mapping={
            str(good.pk): heartbeat_batch.pending_entry(encode(message), time.time()),
            str(bad.pk): json.dumps({"at": time.time(), "frame": '{"type": "heartbeat"}'}),
        },
    )

    assert stats.flush_pending() == 1

    gpu = Gpu.objects.get(host=good, index=0)
    assert (gpu.utilization_pct, gpu.memory_used_bytes) == (91, 7 * f.GIB)
    assert Gpu.objects.get(host=bad, index=0).stats_updated_at == bad_written
    assert client.exists(heartbeat_batch.pending_key()) == 0
    assert stats.flush_pending() == 0


def _poisoned_frame(message: object, **gpu_fields: object) -> str:
    """A heartbeat frame with raw values written in, as a hostile agent would send them."""
    frame = json.loads(encode(message))  # type: ignore[arg-type]
    frame["gpus"][0].update(gpu_fields)
    return json.dumps(frame)


@pytest.mark.parametrize(
    "poison",
    [
        {"memory_used_bytes": 2**63},  # past bigint
        {"processes": [{"pid": 1, "name": "a\u0000b", "memory_bytes": 0}]},  # NUL
        {"processes": [{"pid": 1, "name": "\ud800", "memory_bytes": 0}]},  # lone surrogate
    ],
    ids=["int64", "nul", "surrogate"],
)
def test_one_hosts_poison_telemetry_never_stops_the_others(poison: dict[str, object]) -> None:
    good = f.register_host(gpus=[0])
    bad = f.register_host(gpus=[0])
    message = f.heartbeat([f.gpu_state(0, utilization_pct=64)])
    client = liveness.sync_client()
    client.hset(
        heartbeat_batch.pending_key(),
        mapping={
            str(good.pk): heartbeat_batch.pending_entry(encode(message), time.time()),
            str(bad.pk): heartbeat_batch.pending_entry(
                _poisoned_frame(message, **poison), time.time()
            ),
        },
    )

    assert stats.flush_pending() == 1

    assert Gpu.objects.get(host=good, index=0).utilization_pct == 64
    # Dropped, not handed back to fail every flush from now on.
    assert client.exists(heartbeat_batch.pending_key()) == 0


def test_an_entry_that_postgres_refuses_is_dropped_alone_from_its_batch() -> None:
    # Past the protocol (built in code): whatever Postgres refuses still costs only its host.
    hosts = [f.register_host(gpus=[0]) for _ in range(5)]
    now = timezone.now()
    poison = f.gpu_state(0, utilization_pct=1)
    poison = dataclasses.replace(
        poison, processes=(GpuProcess(pid=1, name="x\x00", memory_bytes=0),)
    )
    items = [
        stats.HostStats(h.pk, now, f.heartbeat([f.gpu_state(0, utilization_pct=33)])) for h in hosts
    ]
    items[2] = stats.HostStats(hosts[2].pk, now, f.heartbeat([poison]))

    stats.write(items)

    written = {g.host_id: g.utilization_pct for g in Gpu.objects.filter(host__in=hosts)}
    assert [written[h.pk] for h in hosts] == [33, 33, 0, 33, 33]


async def test_round_trips_share_the_heartbeats_redis_writes() -> None:
    # Issue 20's pings, answered by a fleet at once: the group commit, not a write each, and
    # no ZADD of nothing when only round trips are waiting.
    await asyncio.gather(*(heartbeat_batch.record_rtt(host, host * 3) for host in range(1, 101)))
    stored = liveness.sync_client().hgetall(heartbeat_batch.rtt_key())
    assert {int(k): int(v) for k, v in stored.items()} == {h: h * 3 for h in range(1, 101)}
    assert liveness.sync_client().zcard(liveness.liveness_key()) == 0


def test_the_flush_writes_round_trips_many_hosts_per_statement() -> None:
    hosts = [f.register_host(gpus=[0]) for _ in range(20)]
    Host.objects.filter(pk=hosts[0].pk).update(rtt_ms=7)
    client = liveness.sync_client()
    client.hset(
        heartbeat_batch.rtt_key(),
        mapping={
            **{str(h.pk): n + 7 for n, h in enumerate(hosts)},  # hosts[0]: 7, unchanged
            "not-a-host": 5,
            "99999999": "not-a-number",
        },
    )

    with CaptureQueriesContext(connection) as queries:
        assert stats.flush_pending() == 0  # no telemetry was pending
    updates = [q for q in queries.captured_queries if "rtt_ms" in q["sql"]]
    assert len(updates) == 1

    assert {h.pk: h.rtt_ms for h in Host.objects.filter(pk__in=[h.pk for h in hosts])} == {
        h.pk: n + 7 for n, h in enumerate(hosts)
    }
    assert client.exists(heartbeat_batch.rtt_key()) == 0


def test_round_trips_a_failed_flush_took_go_back_for_the_next() -> None:
    host = f.register_host(gpus=[0])
    client = liveness.sync_client()
    client.hset(heartbeat_batch.rtt_key(), mapping={str(host.pk): 41})
    with connection.cursor() as cursor:
        # The write fails in Postgres itself, as when the server goes away mid-flush.
        cursor.execute("ALTER TABLE suppliers_host ADD CONSTRAINT rtt_under_40 CHECK (rtt_ms < 40)")
    try:
        with pytest.raises(IntegrityError):
            stats.flush_pending()
        assert int(client.hget(heartbeat_batch.rtt_key(), str(host.pk))) == 41
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE suppliers_host DROP CONSTRAINT rtt_under_40")
    assert stats.flush_pending() == 0
    assert Host.objects.get(pk=host.pk).rtt_ms == 41
