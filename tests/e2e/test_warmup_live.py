"""A rental's warm-up output reaches its page while the warm-up runs (issue 21 item 2), through
the whole hub (Daphne, worker, Redis) and a real Docker agent: the agent streams it as the
lease's log_chunk frames before it acknowledges the start, the page's socket shows it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from websockets.sync.client import connect

from hub.accounts.models import User
from hub.leases import services as lease_services
from hub.leases.models import Lease
from tests.support import control_plane
from tests.support.docker_agent import docker_agent_online
from tests.support.hub_stack import hub_stack
from tests.support.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]

# Waits for a file the test makes only once the page has shown the first line.
WARMUP = ["sh", "-c", "echo still-cold; until [ -e /go ]; do sleep 0.1; done; echo now-warm"]


def test_the_page_shows_the_warm_up_output_while_the_rental_starts(
    tmp_path: Path, docker_client: Any, busybox_image: str
) -> None:
    supplier = User.objects.create_user(username=f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(username=f"renter-{uuid.uuid4().hex[:6]}")
    client = Client()
    client.force_login(renter)
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    with hub_stack(tmp_path) as stack, docker_agent_online(stack, tmp_path, supplier) as host:
        spec = lease_services.LeaseSpec(
            image=busybox_image, command=["sleep", "600"], warmup=list(WARMUP)
        )
        lease = lease_services.start_lease(renter, host, [0], spec)
        port = stack.web_ports[0]
        try:
            with connect(
                f"ws://127.0.0.1:{port}/ws/live/",
                origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
                additional_headers={"Cookie": cookie},
            ) as socket:
                socket.send(json.dumps({"type": "logs.subscribe", "lease_id": str(lease.pk)}))
                page = _read_until(socket, "\nstill-cold\n", "")
                assert Lease.objects.get(pk=lease.pk).state == Lease.State.STARTING
                assert "\nnow-warm\n" not in page
                _let_warm_up_finish(docker_client, lease)
                page = _read_until(socket, "now-warm\n[warm-up] finished\n", page)
            running = wait_for(
                lambda: Lease.objects.filter(pk=lease.pk, state__in=["running", "failed"]).first(),
                timeout_s=60,
                what="the lease running",
            )
            assert running.state == Lease.State.RUNNING, running.failure_reason
            assert page.startswith(f"[warm-up] sh -c '{WARMUP[2]}'\nstill-cold\n")
        finally:
            _let_warm_up_finish(docker_client, lease)  # else the release waits for it
            lease_services.release_lease(lease.pk, Lease.EndReason.RENTER_STOP)
            wait_for(
                lambda: not control_plane.containers(docker_client, lease.pk),
                timeout_s=60,
                what="the lease's container removed",
            )


def _read_until(socket: Any, expected: str, page: str) -> str:
    """The page's text, as live.js builds it from log frames, once it holds ``expected``."""
    while expected not in page:
        message = json.loads(socket.recv(timeout=90))
        if message["type"] == "log":
            page = ("" if message.get("backlog") else page) + message["data"]
    return page


def _let_warm_up_finish(docker_client: Any, lease: Lease) -> None:
    for container in docker_client.containers.list(filters={"label": f"cloudgpu.lease={lease.pk}"}):
        container.exec_run(["touch", "/go"])
