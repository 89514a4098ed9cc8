"""The agent socket on a real Daphne, as a hostile or broken agent would use it: nothing it does
raises into Daphne, and a socket that goes away is always detached from its host."""

from __future__ import annotations

import json
import socket
import struct
import threading
import uuid
from pathlib import Path

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from hub.suppliers import services
from hub.suppliers.models import Host
from tests.hub.factories import make_user, register_message
from tests.support import hub_stack
from tests.support.polling import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_agent_that_vanishes_mid_burst_is_detached_and_nothing_reaches_daphne(
    tmp_path: Path,
) -> None:
    _, token = services.create_agent_token(
        make_user("supplier"), "test", default_price_per_hour_micros=0
    )
    log = tmp_path / "web.log"
    with hub_stack.web_only(log) as port:
        agent_id = str(uuid.uuid4())
        ws = ws_connect(
            f"ws://127.0.0.1:{port}/api/p2p/ws/",
            additional_headers={"Authorization": f"Bearer {token}"},
        )
        ws.send(json.dumps(register_message(agent_id).to_dict()))
        assert json.loads(ws.recv(timeout=10))["type"] == "welcome"
        host = Host.objects.get(agent_id=agent_id)
        assert host.channel_name
        # Chunks for leases of no host: each is looked up and answered "not on this host",
        # after the agent has gone (replies on a closed protocol).
        for seq in range(40):
            chunk = {"type": "log_chunk", "v": 1, "lease_id": str(uuid.uuid4()), "seq": seq}
            ws.send(json.dumps({**chunk, "data": "x"}))
        # Gone at once, no close handshake: RST, as a killed agent or a dropped link.
        raw: socket.socket = ws.socket
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()

        wait_for(
            lambda: not Host.objects.get(pk=host.pk).channel_name,
            timeout_s=30,
            what="the host to be detached from the dead socket",
        )
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    assert "Attempt to send on a closed protocol" not in text


@pytest.mark.parametrize(
    "path",
    ["/api/p2p/ws/../../admin/", "/api/p2p/ws/" + "a" * 10_000, "/api/p2p/ws/%00"],
    ids=["dotdot", "10kb-token", "percent-00"],
)
def test_odd_socket_paths_get_403_from_daphne_without_a_traceback(
    path: str, tmp_path: Path
) -> None:
    log = tmp_path / "web.log"
    with hub_stack.web_only(log) as port:
        with pytest.raises(InvalidStatus) as refused:
            ws_connect(f"ws://127.0.0.1:{port}{path}", open_timeout=5).close()
        assert refused.value.response.status_code == 403
    text = log.read_text(errors="replace")
    assert "Traceback" not in text
    assert "No route found" not in text


def test_a_client_that_drips_its_headers_is_cut_off(tmp_path: Path) -> None:
    with hub_stack.web_only(tmp_path / "web.log") as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            slow.sendall(b"GET /api/p2p/ws/ HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            closed = threading.Event()

            def drip() -> None:
                # One header line a second, for much longer than the deadline: every byte
                # would reset an idle timeout.
                for n in range(40):
                    try:
                        slow.sendall(f"X-Drip-{n}: x\r\n".encode())
                    except OSError:
                        closed.set()
                        return
                    if closed.wait(1):
                        return

            dripper = threading.Thread(target=drip, daemon=True)
            dripper.start()
            slow.settimeout(30)
            try:
                data = slow.recv(100)  # b"" (or a reset) when the server cuts it off
            except ConnectionResetError:
                data = b""
            closed.set()
            dripper.join(timeout=5)
        assert data == b""
