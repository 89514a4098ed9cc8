"""How the agent reaches the hub and introduces itself: the one dialer (bearer token in a
header, never in the URL; no redirects followed), what a refused token looks like, and the
``register`` message. Shared by ``run`` (agent.py), ``smoke`` and the swarm benchmark."""

from __future__ import annotations

from typing import Any

from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from supplier_agent import __version__
from supplier_agent.config import AgentConfig
from supplier_agent.hostinfo import read_host_info
from supplier_agent.protocol import MAX_FRAME_BYTES, ClaimState, Register
from supplier_agent.runtime import HostFacts
from supplier_agent.state import AgentState

WELCOME_TIMEOUT_S = 10.0


class TokenRejected(Exception):
    """The hub refused our token at the handshake (HTTP 401/403)."""


# Close codes a hub may use to refuse a token after accepting the socket (smoke.py too).
TOKEN_CLOSE_CODES = {4001, 4003, 4401, 4403}


class _NoRedirects(connect):
    """websockets follows redirects and re-sends every header, Authorization included, to
    whatever host the redirect names; a hub never redirects its agents, so refuse."""

    def process_redirect(self, exc: Exception) -> Exception | str:
        return exc


def open_connection(config: AgentConfig) -> Any:
    """The one place that dials the hub: bearer token in a header, never in the URL."""
    return _NoRedirects(
        config.ws_url,
        additional_headers={"Authorization": f"Bearer {config.token}"},
        user_agent_header=f"cloudgpu-agent/{__version__}",
        compression=None,  # small JSON frames; deflate costs the hub memory per socket
        open_timeout=WELCOME_TIMEOUT_S,
        max_size=MAX_FRAME_BYTES,
        ping_interval=20,
        ping_timeout=20,
        close_timeout=5,
    )


def classify_handshake_error(exc: Exception) -> Exception:
    if isinstance(exc, InvalidStatus) and exc.response.status_code in {401, 403}:
        return TokenRejected(f"the hub rejected the token (HTTP {exc.response.status_code})")
    return exc


def register_message(
    agent_id: str,
    claims: tuple[ClaimState, ...],
    runtime_name: str,
    gpus: list[Any],
    facts: HostFacts | None = None,
) -> Register:
    host = read_host_info()
    facts = facts or HostFacts()
    return Register(
        agent_id=agent_id,
        hostname=host.hostname,
        os=host.os,
        arch=host.arch,
        cpu_model=host.cpu_model,
        cpu_count=host.cpu_count,
        ram_bytes=host.ram_bytes,
        machine_id=host.machine_id,
        agent_version=__version__,
        runtime=runtime_name,
        gpus=tuple(gpus),
        claims=claims,
        disk_free_bytes=facts.disk_free_bytes,
        driver_version=facts.driver_version,
        cuda_version=facts.cuda_version,
    )


def claim_states(state: AgentState) -> tuple[ClaimState, ...]:
    return tuple(
        ClaimState(
            lease_id=claim.lease_id,
            gpu_indices=tuple(claim.gpu_indices),
            epoch=claim.epoch,
            container_id=claim.container_id,
            ports=dict(claim.ports),
        )
        for claim in state.claims.values()
    )
