from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.test import Client
from django.test.utils import override_settings

from hub.lib.ports import free_port
from tests.support.processes import REPO_ROOT, hub_env


@pytest.mark.django_db
def test_healthz_is_ok_when_postgres_and_redis_answer(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_healthz_names_redis_when_it_is_unreachable(client: Client) -> None:
    # A real refused connection: nothing listens on a port we just found free.
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"):
        response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert body["failing"] == ["redis"]
    assert "ConnectionError" in body["errors"]["redis"]


def test_healthz_names_both_when_neither_is_reachable() -> None:
    dead = free_port()
    script = (
        "import django; django.setup();"
        "from django.test import Client;"
        "r = Client().get('/healthz');"
        "print(r.status_code); print(r.content.decode())"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        env=hub_env(
            DATABASE_URL=f"postgres://nobody@127.0.0.1:{dead}/nothing",
            REDIS_URL=f"redis://127.0.0.1:{dead}/0",
            ALLOWED_HOSTS="testserver",
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    status, body = result.stdout.strip().split("\n", 1)
    assert status == "503"
    assert json.loads(body)["failing"] == ["postgres", "redis"]


def test_healthz_refuses_post(client: Client) -> None:
    assert client.post("/healthz").status_code == 405
