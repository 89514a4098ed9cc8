"""A worker bootstep that reconnects the consumer when kombu has lost track of an ack.

Why: when Redis goes away while a task finishes, the task's ack fails. kombu logs "Couldn't
ack" and swallows the error, but the message stays counted as unacknowledged in the channel's
QoS. With the hub's settings (prefetch multiplier 1, acks late, no remote control, so no
pub/sub socket that would notice the lost connection) the QoS is then full, the consumer
never issues another BRPOP, and the worker sits idle forever although Redis is back
(celery/celery#8030, #9054, #10205; reproduced with celery 5.5.3 and kombu 5.5.4, and kombu
5.7.0 still swallows the failed ack the same way). Every outbox command then waits.

The watchdog compares what the channel's QoS holds unacknowledged with the requests the
worker still knows of. Deliveries that no request will ever ack, on two checks in a row,
mean the count leaked: it raises a connection error in the consumer's event loop, which
Celery handles as a lost broker connection. The consumer reconnects with a fresh channel and
kombu restores the unacked messages to their queue, so the task whose ack failed runs again
(at least once, as acks_late promises; the hub's tasks are idempotent).

This is the one module that reads kombu's private QoS fields (``_delivered``, ``_dirty``);
tests/hub/test_celery_ack_watchdog.py fails when a kombu upgrade changes them.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import bootsteps
from celery.worker import state

log = logging.getLogger(__name__)

CHECK_EVERY_S = 5.0


def leaked_deliveries(channel: Any) -> int:
    """Messages the channel's QoS counts as delivered and unacknowledged beyond the requests
    the worker still holds (reserved, scheduled or running); 0 for a transport without a
    virtual QoS (AMQP acks on the broker, not here)."""
    qos = getattr(channel, "qos", None)
    delivered = getattr(qos, "_delivered", None)
    dirty = getattr(qos, "_dirty", None)
    if delivered is None or dirty is None:
        return 0
    outstanding = len(delivered) - len(dirty)
    return max(0, outstanding - len(state.requests))


class AckWatchdog(bootsteps.StartStopStep):  # type: ignore[misc]  # celery is untyped
    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.timer_entry: Any = None
        self.suspect = False

    def start(self, consumer: Any) -> None:
        self.suspect = False
        self.timer_entry = consumer.timer.call_repeatedly(
            CHECK_EVERY_S, self.check, (consumer,), priority=10
        )

    def stop(self, consumer: Any) -> None:
        if self.timer_entry is not None:
            self.timer_entry.cancel()
            self.timer_entry = None

    def check(self, consumer: Any) -> None:
        task_consumer = getattr(consumer, "task_consumer", None)
        leaked = leaked_deliveries(getattr(task_consumer, "channel", None))
        if not leaked:
            self.suspect = False
            return
        if not self.suspect:
            # A request finishing between our two reads looks the same for an instant.
            self.suspect = True
            return
        self.suspect = False
        log.warning(
            "%d message(s) stay unacknowledged with no task holding them (an ack failed while "
            "the broker was away); reconnecting to the broker so they are redelivered",
            leaked,
        )
        # The event loop re-raises connection errors out of timers (kombu's Hub
        # propagate_errors); builtin ConnectionError is an OSError, which every kombu
        # transport lists among its connection errors.
        raise ConnectionError("broker connection reset: an ack was lost")


def install(app: Any) -> None:
    app.steps["consumer"].add(AckWatchdog)
