"""The agent's metrics endpoint behind a bearer token (supplier_agent/metrics.py): the right token
reads it, a wrong or missing one gets 401; without a token it binds loopback only, and the
token comes from a file or the environment, never from the command line."""

from __future__ import annotations

import os
import secrets
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.lib.ports import free_port
from supplier_agent import metrics
from tests.support.agents import AGENT, agent_env, configure, new_token

TOKEN = secrets.token_urlsafe(32)


def _collector() -> metrics.AgentCollector:
    view = metrics.AgentView(connected=lambda: True, reconnects=lambda: 0, leases=lambda: 2)
    return metrics.AgentCollector(view, None, None)


def _get(port: int, authorization: str | None = None) -> tuple[int, str, dict[str, str]]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if authorization is not None:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 (http only)
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


@pytest.fixture
def guarded() -> Iterator[int]:
    port = free_port()
    server = metrics.serve(f"127.0.0.1:{port}", _collector(), token=TOKEN)
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


def test_the_right_token_reads_the_metrics(guarded: int) -> None:
    status, body, _ = _get(guarded, f"Bearer {TOKEN}")
    assert status == 200
    assert "cloudgpu_agent_leases 2.0" in body


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token-of-some-length", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"],
    # Named, not shown: the token is random, and ids must match across xdist workers.
    ids=["missing", "wrong", "basic", "longer", "empty-bearer"],
)
def test_a_wrong_or_missing_token_gets_401(guarded: int, authorization: str | None) -> None:
    status, body, headers = _get(guarded, authorization)
    assert status == 401
    assert "cloudgpu_agent" not in body
    assert headers["WWW-Authenticate"].startswith("Bearer")


def test_without_a_token_it_stays_on_loopback() -> None:
    with pytest.raises(metrics.MetricsSetupError, match=r"not a loopback address.*token"):
        metrics.serve(f"0.0.0.0:{free_port()}", _collector())
    port = free_port()
    server = metrics.serve(f"127.0.0.1:{port}", _collector())
    try:
        assert _get(port)[0] == 200  # loopback without a token: as before
    finally:
        server.shutdown()
        server.server_close()


def test_with_a_token_it_may_bind_every_address() -> None:
    port = free_port()
    server = metrics.serve(f"0.0.0.0:{port}", _collector(), token=TOKEN)
    try:
        assert _get(port)[0] == 401
        assert _get(port, f"Bearer {TOKEN}")[0] == 200
    finally:
        server.shutdown()
        server.server_close()


def test_the_token_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "token"
    file.write_text(f"{TOKEN}\n")
    environ = {metrics.TOKEN_ENV: "from-the-environment-0123"}
    assert metrics.read_token(str(file), environ) == TOKEN  # the file wins
    assert metrics.TOKEN_ENV not in environ, "children of the agent do not inherit it"
    assert metrics.read_token(None, {metrics.TOKEN_FILE_ENV: str(file)}) == TOKEN
    assert metrics.read_token(None, {metrics.TOKEN_ENV: TOKEN}) == TOKEN
    assert metrics.read_token(None, {}) is None
    with pytest.raises(metrics.MetricsSetupError, match="shorter than 16"):
        metrics.read_token(None, {metrics.TOKEN_ENV: "short"})
    with pytest.raises(metrics.MetricsSetupError, match="cannot read"):
        metrics.read_token(str(tmp_path / "missing"), {})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(metrics.MetricsSetupError, match="empty"):
        metrics.read_token(str(tmp_path / "empty"), {})


def _run(state: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [AGENT, "run", "--state", str(state), *args],
        capture_output=True,
        text=True,
        env=agent_env(**env),
        timeout=60,
        check=False,
    )


def test_run_refuses_a_public_address_without_a_token_and_never_prints_one(
    tmp_path: Path,
) -> None:
    state = tmp_path / "agent"
    # Nothing listens at this hub: the agent stops at its metrics before connecting.
    assert configure(state, "http://127.0.0.1:9", new_token(), "--runtime", "mock").returncode == 0
    refused = _run(state, "--metrics", f"0.0.0.0:{free_port()}")
    assert refused.returncode == 2
    assert "not a loopback address" in refused.stderr
    assert "CLOUDGPU_METRICS_TOKEN_FILE" in refused.stderr
    short = _run(
        state, "--metrics", f"0.0.0.0:{free_port()}", CLOUDGPU_METRICS_TOKEN="tooshort-secret"
    )
    assert short.returncode == 2
    assert "shorter than 16" in short.stderr
    assert "tooshort-secret" not in short.stderr + short.stdout
    # No option takes the token itself.
    usage = subprocess.run([AGENT, "run", "--help"], capture_output=True, text=True, check=True)
    assert "--metrics-token-file" in usage.stdout
    assert "--metrics-token " not in usage.stdout
    assert os.environ.get(metrics.TOKEN_ENV) is None
