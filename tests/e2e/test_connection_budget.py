"""Ordinary web traffic cannot exhaust Postgres: a web process holds at most its pool's
connections however many requests, threads or clients it serves, and answers every request.

Real Daphne on the test database; connections are counted from the operating system's socket
table of the Daphne process, so the count does not depend on how the hub labels them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
from django.db import connection

from hub.accounts.api_tokens import PREFIX, create_api_token
from hub.lib import tokens
from hub.lib.ports import free_port
from tests.hub.factories import make_user
from tests.support.hub_stack import HubStack, hub_stack, web_only

pytestmark = pytest.mark.django_db(transaction=True)

POOL_SIZE = 3
ANONYMOUS_PATHS = ["/", "/offers/", "/healthz", "/api/schema/"]
RENTER_PATHS = ["/api/v1/leases/", "/api/v1/account/", "/api/v1/offers/"]


def _postgres_connections(pid: int) -> int:
    port = int(connection.settings_dict["PORT"] or 5432)
    return sum(
        1
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


@contextmanager
def _peak_connections(pid: int) -> Iterator[Callable[[], int]]:
    """Samples the process's Postgres connections while the block runs; yields the peak so far."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _postgres_connections(pid))
            done.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lambda: peak[0]
    finally:
        done.set()
        sampler.join()


def _requests(stack: HubStack, token: str, rounds: int) -> list[tuple[str, dict[str, str]]]:
    auth = {"Authorization": f"Bearer {token}"}
    one_round = [(stack.url() + p, {}) for p in ANONYMOUS_PATHS] + [
        (stack.url() + p, auth) for p in RENTER_PATHS
    ]
    return one_round * rounds


def _get(client: httpx.Client, url: str, headers: dict[str, str]) -> tuple[str, int]:
    return url, client.get(url, headers=headers).status_code


@pytest.fixture
def renter_token() -> str:
    return create_api_token(make_user("renter"), "load")[1]


def test_sequential_and_concurrent_requests_stay_within_the_pool(
    renter_token: str, tmp_path: Path
) -> None:
    with hub_stack(tmp_path, DATABASE_POOL_MAX_SIZE=str(POOL_SIZE)) as stack:
        pid = stack.web_pids[0]
        with httpx.Client(timeout=60) as client, _peak_connections(pid) as peak:
            # Sequential: under Daphne each request ran on a thread of its own, and each such
            # thread's persistent connection outlived it (14 left open by 100 requests).
            answers = [_get(client, u, h) for u, h in _requests(stack, renter_token, 10)]
            assert [a for a in answers if a[1] != 200] == []
            assert peak() <= POOL_SIZE, f"{peak()} connections after sequential requests"

            # Concurrent: more clients than the pool has connections; they wait their turn
            # instead of opening more (or failing).
            with ThreadPoolExecutor(16) as clients:
                answers = list(
                    clients.map(
                        lambda r: _get(client, *r), _requests(stack, renter_token, 5 * POOL_SIZE)
                    )
                )
            assert [a for a in answers if a[1] != 200] == []
            assert peak() <= POOL_SIZE, f"{peak()} connections under concurrent requests"
            assert peak() >= 1  # the sampler saw the traffic's connections at all
        # The process still answers, and keeps no more than its pool.
        assert httpx.get(stack.url() + "/healthz", timeout=30).status_code == 200
        assert _postgres_connections(pid) <= POOL_SIZE


def test_without_postgres_requests_get_503_with_retry_after(tmp_path: Path) -> None:
    # Nothing listens on the port: every connection attempt is refused, as in an outage.
    with web_only(
        tmp_path / "web.log",
        DATABASE_URL=f"postgres://cloudgpu@127.0.0.1:{free_port()}/cloudgpu",
        DEBUG="0",
        SECRET_KEY="k" * 50,
        DATABASE_POOL_TIMEOUT_S="1",
    ) as port:
        base = f"http://127.0.0.1:{port}"
        # Well formed, so that checking it needs the database.
        token = tokens.generate_token(PREFIX)
        api = httpx.get(base + "/api/v1/account/", headers={"Authorization": f"Bearer {token}"})
        assert api.status_code == 503
        assert api.headers["content-type"] == "application/json"
        assert api.json()["detail"].startswith("The service is briefly unavailable")
        assert int(api.headers["retry-after"]) > 0
        page = httpx.get(base + "/offers/")
        assert page.status_code == 503
        assert "briefly unavailable" in page.text
        assert "Traceback" not in page.text
        assert "OperationalError" not in page.text
        health = httpx.get(base + "/healthz", timeout=30)
        assert health.status_code == 503
        assert health.json()["failing"] == ["postgres"]
