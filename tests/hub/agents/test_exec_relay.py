"""The agent socket's routing of terminal output (hub/agents/exec_relay.py): an agent reaches
only the channels of sessions the hub opened through that very socket, whatever session ids it
sends, and within a budget."""

from __future__ import annotations

import uuid

from hub.agents import exec_relay
from hub.agents.exec_relay import ExecRoutes
from hub.leases import terminals
from supplier_agent.protocol import (
    HUB_TO_AGENT,
    ExecExit,
    ExecOutput,
    Ping,
    Pong,
    parse_message,
)


def _open(routes: ExecRoutes, reply_to: str) -> str:
    sid = str(uuid.uuid4())
    frame = routes.to_agent(
        {"type": terminals.TO_AGENT, "session_id": sid, "reply_to": reply_to, "frame": "{}"}
    )
    assert frame == "{}"
    return sid


def test_output_goes_only_to_the_channel_that_opened_the_session() -> None:
    routes = ExecRoutes()
    sid = _open(routes, "browser-a")
    delivered = routes.from_agent(ExecOutput(session_id=sid, seq=0, data="hi"))
    assert delivered is not None
    assert delivered.channel == "browser-a"
    assert delivered.event == {"type": terminals.OUTPUT, "data": "hi"}
    # A session id the hub never opened here (another host's, or made up) reaches nobody.
    for other in (str(uuid.uuid4()), str(uuid.uuid4())):
        assert routes.from_agent(ExecOutput(session_id=other, seq=0, data="x")) is None
        assert routes.from_agent(ExecExit(session_id=other, exit_code=0)) is None
    ended = routes.from_agent(ExecExit(session_id=sid, exit_code=0))
    assert ended is not None
    assert ended.event["type"] == terminals.EXIT
    # After its exit the session is gone: no more output for it.
    assert routes.from_agent(ExecOutput(session_id=sid, seq=1, data="late")) is None
    assert len(routes) == 0


def test_input_for_a_session_this_socket_does_not_hold_is_not_sent() -> None:
    routes = ExecRoutes()
    event = {"type": terminals.TO_AGENT, "session_id": str(uuid.uuid4()), "frame": "{}"}
    assert routes.to_agent(event) is None


def test_sessions_and_output_are_bounded() -> None:
    routes = ExecRoutes()
    for n in range(exec_relay.MAX_SESSIONS):
        _open(routes, f"browser-{n}")
    extra = {
        "type": terminals.TO_AGENT,
        "session_id": str(uuid.uuid4()),
        "reply_to": "browser-x",
        "frame": "{}",
    }
    assert routes.to_agent(extra) is None
    refusal = routes.refused_open(extra)
    assert refusal is not None
    assert refusal.channel == "browser-x"
    assert "too many terminals" in str(refusal.event["error"])

    routes = ExecRoutes()
    sid = _open(routes, "browser")
    chunk = "x" * 16384
    sent = sum(
        routes.from_agent(ExecOutput(session_id=sid, seq=n, data=chunk)) is not None
        for n in range(exec_relay.BYTES_PER_WINDOW // len(chunk) + 100)
    )
    assert sent == exec_relay.BYTES_PER_WINDOW // len(chunk)


def test_a_closed_connection_tells_every_opener() -> None:
    routes = ExecRoutes()
    a, b = _open(routes, "browser-a"), _open(routes, "browser-b")
    ended = dict(routes.drop_all("gone"))
    assert {d.channel for d in ended.values()} == {"browser-a", "browser-b"}
    assert set(ended) == {a, b}
    assert all(d.event["error"] == "gone" for d in ended.values())
    assert len(routes) == 0


def test_a_terminals_ping_comes_back_to_that_terminal_only() -> None:
    routes = ExecRoutes()
    sid = _open(routes, "browser-a")
    event = terminals.ping_event(sid, "n-7")
    assert routes.to_agent(event) == event["frame"]  # rides the session's own route out
    ping = parse_message(event["frame"], allowed=HUB_TO_AGENT)
    assert isinstance(ping, Ping)
    answered = routes.from_agent(Pong(nonce=ping.nonce))  # what the agent answers
    assert answered is not None
    assert answered.channel == "browser-a"
    assert answered.event == {"type": terminals.PONG, "nonce": "n-7"}
    # Pongs an agent makes up for sessions it was not given, or of no terminal, reach nobody.
    for nonce in (f"exec:{uuid.uuid4()}:1", "exec:", "exec:x", "hub-probe", f"{sid}:1"):
        assert routes.from_agent(Pong(nonce=nonce)) is None
    routes.from_agent(ExecExit(session_id=sid, exit_code=0))
    assert routes.from_agent(Pong(nonce=ping.nonce)) is None  # the session ended


def test_a_clients_ping_nonce_is_short_and_plain() -> None:
    for good in ("1", "a-b_C9", "x" * terminals.MAX_PING_NONCE):
        assert terminals.ping_nonce(good) == good
    for bad in ("", "x" * (terminals.MAX_PING_NONCE + 1), "a:b", "é", "a b", 7, None, ["1"]):
        assert terminals.ping_nonce(bad) is None
