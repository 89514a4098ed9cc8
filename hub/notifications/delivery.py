"""Posting webhook deliveries: a batch at once, each to the address that was checked, each
bounded by WEBHOOK_TIMEOUT_S, so a slow or dead endpoint costs the batch one timeout and never
holds up the other endpoints' requests."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings

from hub.notifications import addresses, backoff, signing
from hub.notifications.models import Event

log = logging.getLogger(__name__)

USER_AGENT = "CloudGPU-Webhooks/1"
# The n-th failed attempt waits RETRY_STEPS[n-1] * WEBHOOK_RETRY_BASE_S (the last step
# repeats) until WEBHOOK_RETRY_FOR_S after the event: with the default base of 30 s, 30 s,
# 2 min, 10 min, 30 min, 1 h, 2 h, 4 h, then every 8 h: 11 attempts in a day.
RETRY_STEPS = (1, 4, 20, 60, 120, 240, 480, 960)
# A batch is one round: every request in flight at once, so a run holds its worker for one
# WEBHOOK_TIMEOUT_S at most, however many endpoints hang.
CONCURRENCY = 64


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
    return backoff.delay(attempts, RETRY_STEPS, settings.WEBHOOK_RETRY_BASE_S)


async def _post(client: httpx.AsyncClient, request: Request, limit: asyncio.Semaphore) -> Outcome:
    started = 0.0  # set once the request may go (after waiting for a slot)

    def outcome(ok: bool, status: int | None, error: str) -> Outcome:
        elapsed_ms = int((time.monotonic() - started) * 1000)
        return Outcome(request.delivery_id, ok, status, error[:300], elapsed_ms)

    async with limit:
        started = time.monotonic()
        try:
            # The whole exchange is bounded, the name's lookup included (a name server that
            # never answers), not only each read: a receiver that drips a byte a second never
            # times out a read.
            async with asyncio.timeout(settings.WEBHOOK_TIMEOUT_S):
                target = await asyncio.to_thread(addresses.resolve, request.url)
                status = await _send(client, request, target)
        except addresses.EndpointRefused as exc:
            return outcome(False, None, f"refused: {exc}")
        except TimeoutError:
            return outcome(False, None, f"no answer within {settings.WEBHOOK_TIMEOUT_S} s")
        except httpx.HTTPError as exc:
            text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return outcome(False, None, text)
        except Exception as exc:  # a URL httpx cannot send, whatever else: this one fails
            log.warning("webhook delivery %s failed: %r", request.delivery_id, exc)
            return outcome(False, None, f"could not send: {type(exc).__name__}")
        ok = 200 <= status < 300
        return outcome(ok, status, "" if ok else f"answered {status}")


async def _send(client: httpx.AsyncClient, request: Request, target: addresses.Target) -> int:
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
    # To the checked address; the name goes in Host and in TLS (SNI and the certificate).
    extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
    built = client.build_request(
        "POST",
        f"{target.scheme}://{connect_to}:{target.port}{target.path}",
        content=request.body,
        headers=headers,
        extensions=extensions,
    )
    response = await client.send(built, stream=True)
    await response.aclose()  # the status is all we keep; the body is not read
    return response.status_code


async def _post_all(requests: list[Request]) -> list[Outcome]:
    limit = asyncio.Semaphore(CONCURRENCY)
    timeout = httpx.Timeout(settings.WEBHOOK_TIMEOUT_S)
    # No kept-alive connections: the pool is keyed by address, not by the TLS name a request
    # was checked for, so two endpoints on one address never share a connection.
    pool = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(
        timeout=timeout, follow_redirects=False, trust_env=False, limits=pool
    ) as client:
        return list(await asyncio.gather(*(_post(client, r, limit) for r in requests)))


def batch_seconds(count: int) -> float:
    """The longest a batch of ``count`` can take: rounds of CONCURRENCY, each one timeout."""
    rounds = -(-count // CONCURRENCY)
    return rounds * (settings.WEBHOOK_TIMEOUT_S + 1)


def post_all(requests: list[Request]) -> list[Outcome]:
    if not requests:
        return []
    # A loop of its own, never set as the thread's: asyncio.run() would unset the thread's loop
    # on its way out, and a caller's loop (a test process's) would then be collected unclosed.
    with asyncio.Runner(loop_factory=asyncio.new_event_loop) as runner:
        return runner.run(_post_all(requests))
