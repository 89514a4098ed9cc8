"""Every Redis key the hub writes itself is under REDIS_KEY_PREFIX (issue 15 item 5), so two
hubs can share one Redis; and a test isolates itself with a settings override."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

from hub.agents import heartbeat_batch
from hub.leases import logs as lease_logs
from hub.lib import redis_keys
from hub.suppliers import liveness
from tests.hub import factories as f


def test_the_hubs_own_keys_follow_the_prefix() -> None:
    with f.private_redis_keys() as prefix:
        assert prefix == settings.REDIS_KEY_PREFIX
        client = liveness.sync_client()
        async_to_sync(heartbeat_batch.record)(7, time.time() + 60, "entry")
        liveness.redis_trusted(time.time())
        client.rpush(lease_logs.backlog_key("lease-1"), "x")
        written = {k.decode() for k in client.scan_iter(match=f"{prefix}:*", count=1000)}
        assert written >= {
            f"{prefix}:host-liveness",
            f"{prefix}:host-telemetry-pending",
            f"{prefix}:sweep-mark",
            f"{prefix}:lease-logs:lease-1",
        }
    # The override's keys went with it, and the names follow the setting back.
    assert not list(liveness.sync_client().scan_iter(match=f"{prefix}:*", count=1000))
    assert redis_keys.key("host-liveness") == f"{settings.REDIS_KEY_PREFIX}:host-liveness"


@pytest.mark.parametrize("setting", ["CHANNEL_LAYERS", "CACHES", "CELERY_BROKER_TRANSPORT_OPTIONS"])
def test_the_channel_layer_cache_and_broker_share_the_prefix(setting: str) -> None:
    prefixes = {
        "CHANNEL_LAYERS": settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"],
        "CACHES": settings.CACHES["default"]["KEY_PREFIX"],
        "CELERY_BROKER_TRANSPORT_OPTIONS": settings.CELERY_BROKER_TRANSPORT_OPTIONS[
            "global_keyprefix"
        ],
    }
    assert prefixes[setting].startswith(settings.REDIS_KEY_PREFIX)
