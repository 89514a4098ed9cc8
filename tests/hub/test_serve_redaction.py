from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from hub.lib.ports import free_port, wait_for_port
from hub.lib.redact import redact
from hub.lib.tokens import generate_token
from hub.serve import RedactingFilter
from tests.support.polling import wait_for
from tests.support.processes import hub_env, python_module, running

TOKEN = "cgpu_" + "A1b2C3d4E5" * 3 + "zZ9yY8"


def test_redact_hides_the_legacy_websocket_path_segment() -> None:
    assert redact('"GET /api/p2p/ws/anything-at-all/x?y=1" 404') == (
        '"GET /api/p2p/ws/[redacted]/x?y=1" 404'
    )


def test_redact_hides_the_path_quoted_without_its_leading_slash() -> None:
    assert redact("No route found for path 'api/p2p/ws/secret'.") == (
        "No route found for path 'api/p2p/ws/[redacted]'."
    )


def test_redact_hides_a_percent_encoded_legacy_path() -> None:
    assert redact("GET /api%2Fp2p%2Fws%2Fsecret") == "GET /api%2Fp2p%2Fws%2F[redacted]"


def test_redact_hides_a_token_anywhere() -> None:
    assert redact(f"Authorization: Bearer {TOKEN}.") == "Authorization: Bearer cgpu_[redacted]."


def test_redact_hides_a_generated_token() -> None:
    token = generate_token()
    assert token not in redact(f"token={token}")


def test_redact_hides_an_enrollment_code() -> None:
    code = generate_token("cgpe_")
    line = f"curl -fsSL https://hub/install.sh | sudo bash -s {code}; cgpe%5F{code[5:]}"
    assert redact(line) == (
        "curl -fsSL https://hub/install.sh | sudo bash -s cgpe_[redacted]; cgpe_[redacted]"
    )


@pytest.mark.parametrize("name", ["token", "access_token", "KEY", "code"])
def test_redact_hides_secret_query_values(name: str) -> None:
    assert redact(f"GET /healthz?a=1&{name}=s3cret&b=2") == (
        f"GET /healthz?a=1&{name}=[redacted]&b=2"
    )


def test_redact_leaves_other_text_alone() -> None:
    line = '127.0.0.1:5000 - - [01/Jan/2025:00:00:00] "GET /healthz?monkey=1&api_key=2" 200 15'
    assert redact(line) == line


def test_filter_redacts_formatted_arguments_and_tracebacks() -> None:
    try:
        raise ValueError(f"No route found for path 'api/p2p/ws/{TOKEN}'.")
    except ValueError as exc:
        exc_info = (type(exc), exc, exc.__traceback__)
        record = logging.LogRecord(
            "django.request", logging.WARNING, __file__, 1, "Not Found: %s", (TOKEN,), exc_info
        )
    assert RedactingFilter().filter(record)
    formatted = logging.Formatter().format(record)
    assert "Not Found: cgpu_[redacted]" in formatted
    assert "ValueError: No route found for path 'api/p2p/ws/[redacted]'." in formatted
    assert TOKEN not in formatted


@pytest.mark.parametrize("access_log", ["stdout", "file"])
def test_hub_serve_never_logs_a_token(tmp_path: Path, access_log: str) -> None:
    token = generate_token()
    port = free_port()
    output = tmp_path / "serve.log"
    access_file = tmp_path / "access.log"
    extra = ["--access-log", str(access_file)] if access_log == "file" else []
    argv = python_module(
        "hub.serve", "-b", "127.0.0.1", "-p", str(port), *extra, "hub.asgi:application"
    )

    def logged() -> str:
        texts = [output.read_text(errors="replace")]
        if access_file.exists():
            texts.append(access_file.read_text(errors="replace"))
        return "\n".join(texts)

    expected = [
        '"GET /api/p2p/ws/[redacted]" 404',
        "WSCONNECTING /api/p2p/ws/[redacted]",
        '"GET /healthz?token=[redacted]"',
        "Not Found: /api/p2p/ws/[redacted]",
    ]
    with running(argv, env=hub_env(), log=output):
        assert wait_for_port(port, timeout_s=60), "hub.serve did not listen"
        base = f"127.0.0.1:{port}"
        with httpx.Client(base_url=f"http://{base}", timeout=30) as client:
            assert client.get(f"/api/p2p/ws/{token}").status_code == 404
            client.get("/healthz", params={"token": token})
        # Accepted or refused (a bad token, or no route), the attempt itself is logged.
        with (
            contextlib.suppress(WebSocketException, OSError),
            connect(f"ws://{base}/api/p2p/ws/{token}", open_timeout=30),
        ):
            pass
        wait_for(
            lambda: all(line in logged() for line in expected),
            timeout_s=30,
            what="the redacted access and error log lines",
        )

    text = logged()
    assert token not in text
    assert token[5:] not in text
    for line in expected:
        assert line in text
    if access_log == "file":
        assert "WSCONNECTING /api/p2p/ws/[redacted]" in access_file.read_text()


def test_with_log_format_json_every_line_is_a_json_object_without_tokens(tmp_path: Path) -> None:
    token = generate_token()
    port = free_port()
    output = tmp_path / "serve.log"
    argv = python_module("hub.serve", "-b", "127.0.0.1", "-p", str(port), "hub.asgi:application")

    def entries() -> list[dict[str, object]]:
        lines = output.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    with running(argv, env=hub_env(LOG_FORMAT="json"), log=output):
        assert wait_for_port(port, timeout_s=60), "hub.serve did not listen"
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            assert client.get(f"/api/p2p/ws/{token}").status_code == 404
        wait_for(
            lambda: {"daphne.access", "django.request"} <= {e["logger"] for e in entries()},
            timeout_s=30,
            what="the access line and Django's 404 warning, as JSON",
        )
    found = entries()  # json.loads raised on any line that is not JSON
    assert token not in output.read_text()
    access = next(e for e in found if e["logger"] == "daphne.access")
    assert '"GET /api/p2p/ws/[redacted]" 404' in str(access["msg"])
    warning = next(e for e in found if e["logger"] == "django.request")
    assert warning["level"] == "WARNING"
    assert {"ts", "msg"} <= set(warning)
