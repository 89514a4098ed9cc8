"""hub/lib/celery_ack_watchdog.py: a worker whose ack failed while Redis was away consumes
again once Redis is back (without it, it never does), and the kombu internals it reads are
still there in the pinned version."""

from __future__ import annotations

import contextlib
import random
import threading
from pathlib import Path

import redis.exceptions
from kombu import Connection
from kombu.exceptions import KombuError as kombu_errors

from hub.lib.celery_ack_watchdog import leaked_deliveries
from hub.lib.ports import free_port
from tests.support.ack_watchdog_app import make_app
from tests.support.polling import wait_for
from tests.support.processes import hub_env, python_module, running
from tests.support.redis_server import own_redis


def test_kombu_counts_an_unacked_delivery_where_the_watchdog_reads_it() -> None:
    with Connection("memory://") as connection:
        channel = connection.channel()
        channel.basic_qos(0, 1, False)
        queue = connection.SimpleQueue("ack-watchdog-compat", channel=channel)
        queue.put({"n": 1})
        message = queue.get(timeout=5)
        assert leaked_deliveries(channel) == 1  # delivered, not acked, no worker request
        message.ack()
        assert leaked_deliveries(channel) == 0
        queue.close()


def test_a_channel_without_a_virtual_qos_has_nothing_to_leak() -> None:
    assert leaked_deliveries(None) == 0
    assert leaked_deliveries(object()) == 0


MAX_CYCLES = 60


def test_a_worker_consumes_again_after_redis_dies_mid_ack_again_and_again(tmp_path: Path) -> None:
    """Tasks as the beat sends them (a stream of short ones that expire), Redis killed at
    random moments and restarted until an ack was lost: after each restart the worker runs new
    tasks. Without the watchdog (ACK_TEST_WATCHDOG=0) the worker stalls for good once Redis dies
    as an ack is being sent, which took 1 to 5 restarts in trials."""
    port = free_port()
    broker = f"redis://127.0.0.1:{port}/0"
    env = hub_env(ACK_TEST_BROKER=broker, ACK_TEST_DIR=str(tmp_path))
    log = tmp_path / "worker.log"
    argv = python_module(
        "celery",
        "-A",
        "tests.support.ack_watchdog_app",
        "worker",
        "-P",
        "solo",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-l",
        "INFO",
    )
    client = make_app(broker)
    rng = random.Random(1234)
    stop = threading.Event()

    def send_stream() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            # While Redis is down a send fails; the next one tries again.
            with contextlib.suppress(OSError, redis.exceptions.RedisError, kombu_errors):
                client.send_task("ack_test.mark", args=[f"s{n}"], retry=False, expires=1.0)
            stop.wait(0.01)

    redis_server = own_redis(port, tmp_path / "redis-0.log")
    redis_server.__enter__()
    sender = threading.Thread(target=send_stream, daemon=True)
    try:
        with running(argv, env=env, log=log):
            sender.start()
            for cycle in range(MAX_CYCLES):
                wanted = len(list(tmp_path.glob("*.done"))) + 3
                wait_for(
                    lambda wanted=wanted: len(list(tmp_path.glob("*.done"))) > wanted,
                    timeout_s=60,
                    what=f"the worker running tasks (cycle {cycle})",
                )
                if "reconnecting to the broker" in log.read_text(errors="replace"):
                    break  # an ack was lost, and tasks ran again after it
                stop.wait(rng.uniform(0.0, 0.3))  # a random moment in the stream
                redis_server.__exit__(None, None, None)
                stop.wait(rng.uniform(0.2, 0.8))
                redis_server = own_redis(port, tmp_path / f"redis-{cycle + 1}.log")
                redis_server.__enter__()
            text = log.read_text(errors="replace")
            lost = text.count("Couldn't ack")
            print(f"{cycle + 1} restarts, {lost} lost ack(s)")
            assert "reconnecting to the broker" in text, "no ack was lost: the race was not hit"
    finally:
        stop.set()
        sender.join(timeout=10)
        client.close()
        redis_server.__exit__(None, None, None)
