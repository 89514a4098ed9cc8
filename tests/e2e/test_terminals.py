"""End to end: a renter's terminal in their running lease, through the real hub (Daphne, the
channel layer, worker and beat), a real agent with the Docker runtime and a busybox container.
Who may open one (the renter only: not another renter, not staff), what the session record
keeps, and what happens when the shell exits or the renter leaves."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.contrib.sessions.models import Session
from django.test import Client
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from hub.accounts.api_tokens import create_api_token
from hub.accounts.models import User
from hub.leases.models import ExecSession, Lease
from tests.support.control_plane import lease_state, start_lease
from tests.support.docker_agent import docker_agent_online
from tests.support.hub_stack import HubStack, hub_stack
from tests.support.polling import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.docker]


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[HubStack]:
    (tmp_path / "hub").mkdir()
    with hub_stack(tmp_path / "hub") as running:
        yield running


def _cookie(user: User) -> str:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


def _terminal(stack: HubStack, lease_id: str, user: User, query: str = "") -> ClientConnection:
    port = stack.web_ports[0]
    return ws_connect(
        f"ws://127.0.0.1:{port}/ws/leases/{lease_id}/terminal/{query}",
        additional_headers={"Cookie": _cookie(user), "Origin": f"http://127.0.0.1:{port}"},
        open_timeout=30,
    )


class Screen:
    """What the terminal socket said, as a renter's browser reads it."""

    def __init__(self, socket: ClientConnection) -> None:
        self.socket = socket
        self.text = ""
        self.exit: dict[str, Any] | None = None
        self.pongs: list[str] = []

    def type(self, data: str) -> None:
        self.socket.send(json.dumps({"type": "input", "data": data}))

    def until(self, what: str, check: Any, timeout_s: float = 60) -> None:
        def read() -> bool:
            if check(self):
                return True
            try:
                message = json.loads(self.socket.recv(timeout=1))
            except TimeoutError:
                return False
            if message["type"] == "output":
                self.text += message["data"]
            elif message["type"] == "exit":
                self.exit = message
            elif message["type"] == "pong":
                self.pongs.append(message["nonce"])
            return bool(check(self))

        wait_for(read, timeout_s=timeout_s, what=what)


def _running_lease(stack: HubStack, renter: User, host: Any, image: str) -> str:
    lease_id = start_lease(stack, renter, host, "--image", image, "--command", "sleep", "3600")
    lease = wait_for(
        lambda: lease_state(lease_id, "running", "failed"), timeout_s=120, what="running"
    )
    assert lease.state == "running", lease.failure_reason
    return lease_id


def test_the_renter_gets_a_shell_and_nobody_else_does(
    stack: HubStack, tmp_path: Path, busybox_image: str, docker_client: Any
) -> None:
    supplier = User.objects.create_user(f"supplier-{uuid.uuid4().hex[:6]}")
    renter = User.objects.create_user(f"renter-{uuid.uuid4().hex[:6]}")
    other = User.objects.create_user(f"other-{uuid.uuid4().hex[:6]}")
    staff = User.objects.create_user(f"staff-{uuid.uuid4().hex[:6]}", is_staff=True)
    with docker_agent_online(stack, tmp_path, supplier) as host:
        lease_id = _running_lease(stack, renter, host, busybox_image)
        try:
            with _terminal(stack, lease_id, renter, "?cols=100&rows=30") as socket:
                screen = Screen(socket)
                screen.type("echo hi-$((40+2))\r")
                screen.until("the shell's answer", lambda s: "hi-42" in s.text)
                # A ping goes to the host's agent and back, as the page shows its latency; one
                # it cannot read is dropped.
                for nonce in ("a:b", "x" * 33, "p-1"):
                    socket.send(json.dumps({"type": "ping", "nonce": nonce}))
                screen.until("the pong", lambda s: s.pongs == ["p-1"])
                screen.type("stty size\r")
                screen.until("the first size", lambda s: "30 100" in s.text)
                socket.send(json.dumps({"type": "resize", "cols": 132, "rows": 43}))
                screen.type("stty size\r")
                screen.until("the new size", lambda s: "43 132" in s.text)
                # 11 bytes of UTF-8 and the newline reach the shell; the echo shows them back.
                screen.type("echo \"u:$(echo 'grüße ✓' | wc -c)\"\r")
                screen.until("UTF-8 through", lambda s: "u:12" in s.text.replace(" ", ""))
                assert "grüße ✓" in screen.text
                # Junk a browser could send changes nothing.
                for junk in ("{", "[]", '{"type": "resize", "cols": 0, "rows": 5}'):
                    socket.send(junk)
                screen.type("exit 5\r")
                screen.until("the exit", lambda s: s.exit is not None)
            assert screen.exit == {"type": "exit", "exit_code": 5, "error": None}
            session = wait_for(
                lambda: ExecSession.objects.filter(
                    lease_id=lease_id, user=renter, closed_at__isnull=False
                ).first(),
                timeout_s=30,
                what="the session record",
            )
            assert session.via == "web"
            assert session.exit_code == 5

            # Another renter, and staff, get the answer of a lease that does not exist.
            for stranger in (other, staff):
                with _terminal(stack, lease_id, stranger) as socket:
                    screen = Screen(socket)
                    screen.until("the refusal", lambda s: s.exit is not None, timeout_s=30)
                assert screen.exit["error"] == "no such rental of yours"
                assert socket.close_code == 4403
            assert not ExecSession.objects.filter(user__in=[other, staff]).exists()

            # Leaving ends the shell's process and the record.
            with _terminal(stack, lease_id, renter) as socket:
                screen = Screen(socket)
                screen.type("echo ready; exec sleep 3599\r")
                screen.until("the program", lambda s: "ready" in s.text.split("3599")[-1])
            container = docker_client.containers.list(
                filters={"label": f"cloudgpu.lease={lease_id}"}
            )[0]
            wait_for(
                lambda: not any("3599" in p[-1] for p in container.top()["Processes"]),
                timeout_s=30,
                what="the shell's program to end with the tab",
            )
            wait_for(
                lambda: not ExecSession.objects.filter(
                    lease_id=lease_id, closed_at__isnull=True
                ).exists(),
                timeout_s=30,
                what="every session closed",
            )
            reasons = list(ExecSession.objects.filter(lease_id=lease_id).values_list("end_reason"))
            assert ("closed by the renter",) in reasons, reasons

            # Signing out (here: the session row gone, as logout does) ends the terminal.
            cookie = _cookie(renter)
            port = stack.web_ports[0]
            with ws_connect(
                f"ws://127.0.0.1:{port}/ws/leases/{lease_id}/terminal/",
                additional_headers={"Cookie": cookie, "Origin": f"http://127.0.0.1:{port}"},
                open_timeout=30,
            ) as socket:
                screen = Screen(socket)
                screen.type("echo signed-in\r")
                screen.until("the shell", lambda s: "signed-in" in s.text.split("echo")[-1])
                Session.objects.filter(session_key=cookie.split("=", 1)[1]).delete()
                screen.until("the end of the session", lambda s: s.exit is not None)
            assert screen.exit["error"] == "signed out: the session ended"
            assert socket.close_code == 4401

            # The API: one command and its answer, with a token of the renter's own.
            _, token = create_api_token(renter, "exec", ["read", "leases"])
            _, read_only = create_api_token(renter, "ro", ["read"])
            _, strangers = create_api_token(other, "other", ["read", "leases"])
            url = f"{stack.url()}/api/v1/leases/{lease_id}/exec/"

            def post(bearer: str, body: object) -> httpx.Response:
                return httpx.post(
                    url, json=body, headers={"Authorization": f"Bearer {bearer}"}, timeout=60
                )

            answer = post(token, {"command": ["sh", "-c", "echo out; echo err >&2; exit 3"]})
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["exit_code"] == 3
            assert "out" in body["output"]
            assert "err" in body["output"]
            assert body["error"] is None
            assert post(read_only, {"command": ["true"]}).status_code == 401
            assert post(strangers, {"command": ["true"]}).status_code == 404
            assert post(token, {"command": "true"}).status_code == 400
            slow = post(token, {"command": ["sleep", "30"], "timeout_s": 1})
            assert slow.status_code == 504, slow.text
            assert "still running after 1 s" in slow.json()["error"]

            # The API's interactive terminal: the same frames, with the token.
            with ws_connect(
                f"ws://127.0.0.1:{stack.web_ports[0]}/api/v1/leases/{lease_id}/terminal/",
                additional_headers={"Authorization": f"Bearer {token}"},
                open_timeout=30,
            ) as socket:
                screen = Screen(socket)
                screen.type("echo api-$((6*7)); exit\r")
                screen.until("the API terminal", lambda s: s.exit is not None)
            assert "api-42" in screen.text
            assert ExecSession.objects.filter(lease_id=lease_id, via="api").count() == 3

            # Admins from the CLI, recorded under their own name.
            admin = User.objects.create_user(f"admin-{uuid.uuid4().hex[:6]}", is_staff=True)
            printed = stack.manage(
                "hub", "lease", "exec", lease_id, "--as", admin.username, "--", "echo", "cli-ok"
            )
            assert printed == "cli-ok"
            assert ExecSession.objects.filter(lease_id=lease_id, user=admin, via="cli").exists()
        finally:
            stack.manage("hub", "lease", "release", lease_id)
            wait_for(lambda: lease_state(lease_id, "ended"), timeout_s=60, what="ended")

    # An ended lease has no terminal.
    assert Lease.objects.get(pk=lease_id).state == "ended"
    with _terminal(stack, lease_id, renter) as socket:
        screen = Screen(socket)
        screen.until("the refusal", lambda s: s.exit is not None, timeout_s=30)
    assert "a terminal needs it running" in screen.exit["error"]
