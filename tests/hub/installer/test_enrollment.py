"""``POST /agent/enroll`` as an attacker would try it: a code works once, while fresh, for an
active account, and nothing else gets a token; bad guesses are limited per address."""

from __future__ import annotations

import json
import secrets
import threading
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone

from hub.accounts.models import User
from hub.installer import enrollment
from hub.installer.models import EnrollmentCode
from hub.lib import tokens
from hub.suppliers.models import AgentToken
from hub.suppliers.services import authenticate_agent_token
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

URL = "/agent/enroll"


def _address() -> str:
    # The failure counters live in Redis across tests and runs: each test its own address.
    return f"10.{secrets.randbelow(256)}.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}"


def _post(code: Any, *, address: str, host: str = "gpu-box", **extra: Any) -> Any:
    client = Client(REMOTE_ADDR=address)
    body = json.dumps({"code": code, "host": host})
    return client.post(URL, body, content_type="application/json", **extra)


def _tokens_of(owner: User) -> int:
    return AgentToken.objects.filter(owner=owner).count()


def test_a_code_is_exchanged_once_for_a_new_working_token_of_its_owner() -> None:
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier, "rig-7")
    address = _address()

    response = _post(plaintext, address=address, host="gpu-07")

    assert response.status_code == 201
    assert "no-store" in response["Cache-Control"]
    token = response.json()["token"]
    assert tokens.well_formed(token)
    agent_token = authenticate_agent_token(token)
    assert agent_token is not None
    assert agent_token.owner == supplier
    assert agent_token.name == "rig-7"
    code.refresh_from_db()
    assert code.used_at is not None
    assert code.token == agent_token
    assert code.used_from == address
    assert code.used_by_host == "gpu-07"
    # The code itself is no credential for an agent.
    assert authenticate_agent_token(plaintext) is None


def test_an_unnamed_code_names_the_token_after_the_host() -> None:
    _, plaintext = enrollment.create_enrollment_code(f.make_user("supplier"))
    response = _post(plaintext, address=_address(), host="gpu-\x00box\x1b[31m\ud800")
    assert response.status_code == 201
    assert response.json()["name"] == "gpu-box[31m"


def test_a_used_code_is_refused_and_mints_nothing() -> None:
    supplier = f.make_user("supplier")
    _, plaintext = enrollment.create_enrollment_code(supplier)
    assert _post(plaintext, address=_address()).status_code == 201

    again = _post(plaintext, address=_address())

    assert again.status_code == 410
    assert again.json()["error"] == "used"
    assert "already used" in again.json()["detail"]
    assert "token" not in again.json()
    assert _tokens_of(supplier) == 1


def test_a_code_lives_enrollment_code_ttl_s_and_an_expired_one_is_refused(settings: Any) -> None:
    settings.ENROLLMENT_CODE_TTL_S = 120
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier)
    assert abs(code.expires_at - code.created_at - timedelta(seconds=120)) < timedelta(seconds=1)
    # Time passes: the row is aged, not the clock.
    EnrollmentCode.objects.filter(pk=code.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )

    response = _post(plaintext, address=_address())

    assert response.status_code == 410
    assert response.json()["error"] == "expired"
    assert "expired" in response.json()["detail"]
    assert _tokens_of(supplier) == 0
    code.refresh_from_db()
    assert code.used_at is None


def test_a_cancelled_code_is_refused() -> None:
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier)
    assert enrollment.revoke_enrollment_code(supplier, code.pk)
    assert not enrollment.revoke_enrollment_code(supplier, code.pk)

    response = _post(plaintext, address=_address())

    assert response.status_code == 410
    assert response.json()["error"] == "revoked"
    assert _tokens_of(supplier) == 0


def test_nobody_else_can_cancel_a_code() -> None:
    supplier, other = f.make_user("supplier"), f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier)
    assert not enrollment.revoke_enrollment_code(other, code.pk)
    assert _post(plaintext, address=_address()).status_code == 201


def test_a_code_of_a_disabled_account_gets_no_token() -> None:
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier)
    User.objects.filter(pk=supplier.pk).update(is_active=False)

    response = _post(plaintext, address=_address())

    assert response.status_code == 403
    assert response.json()["error"] == "account_disabled"
    assert _tokens_of(supplier) == 0
    code.refresh_from_db()
    assert code.used_at is None


def _checksum_broken(code: str) -> str:
    last = "A" if code[-1] != "A" else "B"
    return code[:-1] + last


@pytest.mark.parametrize(
    ("make_code", "status", "error"),
    [
        # Well formed, checksum and all, but never issued: a guess.
        (lambda code: tokens.generate_token(enrollment.PREFIX), 404, "unknown"),
        (_checksum_broken, 400, "malformed"),
        # The owner's token or an API token is no enrollment code.
        (lambda code: tokens.generate_token(), 400, "malformed"),
        (lambda code: tokens.generate_token("cgpr_"), 400, "malformed"),
        (lambda code: code.lower(), 400, "malformed"),
        (lambda code: code + "x", 400, "malformed"),
        (lambda code: code[:-1], 400, "malformed"),
        (lambda code: " " + code, 400, "malformed"),
        (lambda code: code + "\x00", 400, "malformed"),
        (lambda code: "", 400, "malformed"),
        (lambda code: "cgpe_" + "A" * 10_000, 413, "too_large"),
        (lambda code: 12345, 400, "bad_request"),
        (lambda code: [code], 400, "bad_request"),
        (lambda code: None, 400, "bad_request"),
    ],
)
def test_made_up_and_malformed_codes_get_nothing(make_code: Any, status: int, error: str) -> None:
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier)

    response = _post(make_code(plaintext), address=_address())

    assert response.status_code == status
    assert response.json()["error"] == error
    assert "token" not in response.json()
    assert _tokens_of(supplier) == 0
    code.refresh_from_db()
    assert code.used_at is None


@pytest.mark.parametrize(
    "body",
    [b"not json", b"\xff\xfe", b"[" * 2000 + b"]" * 2000, b'"cgpe_"', b"{}", b'{"host": "x"}'],
)
def test_bodies_that_are_not_an_exchange_are_refused(body: bytes) -> None:
    client = Client(REMOTE_ADDR=_address())
    response = client.post(URL, body, content_type="application/json")
    assert response.status_code in (400, 413)
    assert response.json()["error"] in ("bad_request", "too_large")


def test_a_code_in_the_url_is_refused_and_stays_unused() -> None:
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier)
    client = Client(REMOTE_ADDR=_address())

    response = client.post(
        f"{URL}?code={plaintext}", json.dumps({"code": plaintext}), content_type="application/json"
    )

    assert response.status_code == 400
    assert response.json()["error"] == "code_in_url"
    code.refresh_from_db()
    assert code.used_at is None


def test_only_post_exchanges_a_code() -> None:
    _, plaintext = enrollment.create_enrollment_code(f.make_user("supplier"))
    client = Client(REMOTE_ADDR=_address())
    assert client.get(URL, {"code": plaintext}).status_code == 405
    assert client.put(URL, json.dumps({"code": plaintext})).status_code == 405


def test_a_flood_of_bad_codes_is_limited_per_address(settings: Any) -> None:
    settings.ENROLLMENT_RATE_LIMIT = 3
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier)
    flooder = _address()
    for _ in range(3):
        guess = tokens.generate_token(enrollment.PREFIX)
        assert _post(guess, address=flooder).status_code == 404

    blocked = _post(plaintext, address=flooder)

    # Even the right code, once the address has used up its failures.
    assert blocked.status_code == 429
    assert blocked.json()["error"] == "rate_limited"
    assert int(blocked["Retry-After"]) == settings.ENROLLMENT_RATE_WINDOW_S
    code.refresh_from_db()
    assert code.used_at is None
    # Another address is not held back by the flood.
    assert _post(plaintext, address=_address()).status_code == 201


def test_the_limit_covers_a_whole_ipv6_slash_64(settings: Any) -> None:
    settings.ENROLLMENT_RATE_LIMIT = 2
    _, plaintext = enrollment.create_enrollment_code(f.make_user("supplier"))
    net = f"2001:db8:{secrets.randbelow(65536):x}:{secrets.randbelow(65536):x}"
    assert _post("cgpe_guess", address=f"{net}::1").status_code == 400
    assert _post("cgpe_guess", address=f"{net}::2").status_code == 400
    assert _post(plaintext, address=f"{net}:ffff::3").status_code == 429
    other_net = f"2001:db8:{secrets.randbelow(65536):x}:{secrets.randbelow(65536):x}::1"
    assert _post(plaintext, address=other_net).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_two_exchanges_of_one_code_at_once_make_exactly_one_token() -> None:
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier)
    racers = 8
    start = threading.Barrier(racers)
    results: list[tuple[int, dict[str, Any]]] = []
    lock = threading.Lock()

    def exchange() -> None:
        try:
            start.wait(timeout=30)
            response = _post(plaintext, address=_address())
            with lock:
                results.append((response.status_code, response.json()))
        finally:
            connection.close()  # each thread has its own; the test database must be droppable

    threads = [threading.Thread(target=exchange) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert len(results) == racers
    winners = [body for status, body in results if status == 201]
    assert len(winners) == 1
    assert sorted(body["error"] for status, body in results if status != 201) == ["used"] * (
        racers - 1
    )
    assert _tokens_of(supplier) == 1
    code.refresh_from_db()
    assert authenticate_agent_token(winners[0]["token"]) == code.token


def test_codes_are_stored_as_digests_only() -> None:
    supplier = f.make_user("supplier")
    code, plaintext = enrollment.create_enrollment_code(supplier, "x")
    row = EnrollmentCode.objects.filter(pk=code.pk).values().get()
    assert plaintext not in json.dumps(row, default=str)
    assert row["digest"] == tokens.digest(plaintext)
    assert row["prefix"] == plaintext[:11]
    assert plaintext.startswith("cgpe_")
    assert tokens.well_formed(plaintext, enrollment.PREFIX)
