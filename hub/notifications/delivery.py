"""Posting webhook deliveries: a batch at once, each to the address that was checked, each
bounded by WEBHOOK_TIMEOUT_S, so a slow or dead endpoint costs the batch one timeout and never
holds up the other endpoints' requests."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings

from hub.notifications import addresses, signing
from hub.notifications.models import Event

USER_AGENT = "CloudGPU-Webhooks/1"
# The n-th failed attempt waits RETRY_STEPS[n-1] * WEBHOOK_RETRY_BASE_S (the last step
# repeats) until WEBHOOK_RETRY_FOR_S after the event: with the default base of 30 s, 30 s,
# 2 min, 10 min, 30 min, 1 h, 2 h, 4 h, then every 8 h: 11 attempts in a day.
RETRY_STEPS = (1, 4, 20, 60, 120, 240, 480, 960)
CONCURRENCY = 32


@dataclass(frozen=True)
class Request:
    delivery_id: int
    url: str
    secret: str
    body: bytes
    event_id: str
    kind: str


@dataclass(frozen=True)
class Outcome:
    delivery_id: int
    ok: bool
    status: int | None
    error: str
    duration_ms: int


def body(event: Event) -> bytes:
    document: dict[str, Any] = {
        "id": str(event.id),
        "type": event.kind,
        "created": event.created_at.isoformat().replace("+00:00", "Z"),
        "data": event.data,
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=True).encode()


def retry_delay(attempts: int) -> timedelta:
    step = RETRY_STEPS[min(attempts, len(RETRY_STEPS)) - 1]
    seconds = step * settings.WEBHOOK_RETRY_BASE_S
    return timedelta(seconds=seconds * random.uniform(0.9, 1.1))  # noqa: S311  # spread retries


async def _post(client: httpx.AsyncClient, request: Request, limit: asyncio.Semaphore) -> Outcome:
    started = time.monotonic()

    def outcome(ok: bool, status: int | None, error: str) -> Outcome:
        return Outcome(
            request.delivery_id, ok, status, error[:300], int((time.monotonic() - started) * 1000)
        )

    async with limit:
        try:
            target = await asyncio.to_thread(addresses.resolve, request.url)
        except addresses.EndpointRefused as exc:
            return outcome(False, None, f"refused: {exc}")
        timestamp = int(time.time())
        host_header = target.host if ":" not in target.host else f"[{target.host}]"
        default_port = 443 if target.scheme == "https" else 80
        if target.port != default_port:
            host_header += f":{target.port}"
        connect_to = target.address if ":" not in target.address else f"[{target.address}]"
        headers = {
            "Host": host_header,
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "CloudGPU-Event-Id": request.event_id,
            "CloudGPU-Event-Type": request.kind,
            signing.SIGNATURE_HEADER: signing.header(request.secret, timestamp, request.body),
        }
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        built = client.build_request(
            "POST",
            f"{target.scheme}://{connect_to}:{target.port}{target.path}",
            content=request.body,
            headers=headers,
            extensions=extensions,
        )
        try:
            # The whole exchange is bounded, not only each read: a receiver that drips a
            # byte a second never times out a read.
            async with asyncio.timeout(settings.WEBHOOK_TIMEOUT_S):
                response = await client.send(built, stream=True)
                await response.aclose()  # the status is all we keep; the body is not read
        except TimeoutError:
            return outcome(False, None, f"no answer within {settings.WEBHOOK_TIMEOUT_S} s")
        except httpx.HTTPError as exc:
            return outcome(
                False, None, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            )
        ok = 200 <= response.status_code < 300
        return outcome(ok, response.status_code, "" if ok else f"answered {response.status_code}")


async def _post_all(requests: list[Request]) -> list[Outcome]:
    limit = asyncio.Semaphore(CONCURRENCY)
    timeout = httpx.Timeout(settings.WEBHOOK_TIMEOUT_S)
    async with httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, trust_env=False
    ) as client:
        return list(await asyncio.gather(*(_post(client, r, limit) for r in requests)))


def post_all(requests: list[Request]) -> list[Outcome]:
    if not requests:
        return []
    return asyncio.run(_post_all(requests))
