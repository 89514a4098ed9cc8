"""emit(): what the rest of the hub calls when something an account should hear about happens.

The event is a row written in the caller's transaction (so it exists exactly when what it
tells of committed); a Celery task sends it after commit, and the beat's sweep sends whatever
a lost task left. A kind that comes in bursts (a fleet going offline, ten rentals started at
once) is coalesced: within NOTIFY_COALESCE_S of the first, more of the same kind for the same
account join its items, and one email and one webhook carry them all.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from hub.celery import app as celery_app
from hub.notifications.kinds import KINDS
from hub.notifications.models import Event

log = logging.getLogger(__name__)

PROCESS_TASK = "notifications.process_events"
# A coalesced event keeps this many items in full; beyond, only its count grows.
MAX_ITEMS = 100


# Words in an event come partly from agents (a failure's reason, a host's name): each string
# is cut here, so no event, email or webhook body grows with what a host reports.
MAX_STRING = 500
MAX_LIST = 100


def bounded(value: Any) -> Any:
    """``value`` with every string cut to MAX_STRING characters and list to MAX_LIST items."""
    if isinstance(value, str):
        return value if len(value) <= MAX_STRING else value[: MAX_STRING - 1] + "…"
    if isinstance(value, dict):
        return {str(k)[:MAX_STRING]: bounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [bounded(v) for v in value[:MAX_LIST]]
    return value


def emit(account_id: int, kind: str, data: dict[str, Any], now: datetime | None = None) -> None:
    """Record that ``kind`` happened to the account, with ``data`` (JSON: ids, names, amounts,
    never a secret). For a coalesced kind, ``data`` is one item."""
    spec = KINDS[kind]
    now = now or timezone.now()
    data = bounded(data)
    with transaction.atomic():
        if spec.coalesce:
            window = timedelta(seconds=settings.NOTIFY_COALESCE_S)
            open_event = (
                Event.objects.select_for_update()
                # Not one a sweep already took up (its deliveries made, or its email failed
                # and waits for a retry): its receivers would never see a later item.
                .filter(
                    account_id=account_id,
                    kind=kind,
                    state=Event.State.PENDING,
                    due_at__gt=now,
                    webhooks_made=False,
                    email_attempts=0,
                )
                .order_by("created_at")
                .first()
            )
            if open_event is not None:
                items = list(open_event.data.get("items", []))
                if len(items) < MAX_ITEMS:
                    items.append(data)
                count = int(open_event.data.get("count", len(items))) + 1
                open_event.data = {"items": items, "count": count}
                open_event.save(update_fields=["data"])
                return
            Event.objects.create(
                account_id=account_id,
                kind=kind,
                data={"items": [data], "count": 1},
                due_at=now + window,
            )
            return  # the sweep sends it once its window closed
        Event.objects.create(account_id=account_id, kind=kind, data=data, due_at=now)
        # As hub/leases/services.py queues commands: with the broker down the row still
        # commits, and the sweep sends it.
        transaction.on_commit(
            lambda: celery_app.send_task(PROCESS_TASK, ignore_result=True), robust=True
        )
