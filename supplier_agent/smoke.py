"""``cloudgpu-agent smoke``: one handshake with the hub, then exit.

0 the hub welcomed us; 3 no answer within 10 s; 4 the token was rejected; 1 anything else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from supplier_agent.config import AgentConfig
from supplier_agent.hub_link import (
    TOKEN_CLOSE_CODES,
    WELCOME_TIMEOUT_S,
    TokenRejected,
    classify_handshake_error,
    open_connection,
    register_message,
)
from supplier_agent.mock_runtime import MockRuntime
from supplier_agent.protocol import (
    HUB_TO_AGENT,
    Error,
    ProtocolError,
    Welcome,
    encode,
    parse_message,
)
from supplier_agent.state import load_agent_id


async def _handshake(config: AgentConfig) -> Welcome:
    # Read-only use of the state folder: the agent may be running on it right now.
    agent_id = load_agent_id(config.state_dir)
    if config.runtime == "mock":
        gpus = await MockRuntime(agent_id).gpus()
    else:
        from supplier_agent.gpu import Nvml

        gpus = Nvml().gpus()
    try:
        connection = await open_connection(config)
    except InvalidStatus as exc:
        raise classify_handshake_error(exc) from None
    async with connection as ws:
        probe = dataclasses.replace(
            register_message(agent_id, (), config.runtime, gpus), probe=True
        )
        await ws.send(encode(probe))
        while True:
            try:
                frame = await ws.recv()
            except ConnectionClosed as exc:
                if exc.rcvd is not None and exc.rcvd.code in TOKEN_CLOSE_CODES:
                    raise TokenRejected(
                        f"the hub closed the connection: {exc.rcvd.reason}"
                    ) from None
                raise
            message = parse_message(frame, allowed=HUB_TO_AGENT)
            if isinstance(message, Welcome):
                return message
            if isinstance(message, Error):
                raise ProtocolError(f"the hub refused registration: {message.reason}")


def run_smoke(config: AgentConfig) -> int:
    try:
        welcome = asyncio.run(asyncio.wait_for(_handshake(config), WELCOME_TIMEOUT_S))
    except TokenRejected as exc:
        print(f"smoke: {exc}", file=sys.stderr)
        return 4
    except (TimeoutError, asyncio.TimeoutError):
        print(f"smoke: no answer from {config.ws_url} within 10 s", file=sys.stderr)
        return 3
    except (OSError, InvalidHandshake, ConnectionClosed, ProtocolError) as exc:
        print(f"smoke: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"smoke: ok, the hub knows this machine as host {welcome.host_id}")
    return 0
