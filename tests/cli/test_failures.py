"""Every way a call to the hub can fail is one stderr line and its exit code, never a
traceback or the token: against a real HTTP server on 127.0.0.1 (tests/cli/canned_hub.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hub.lib.ports import free_port
from tests.cli.canned_hub import CannedHub, canned_hub, cloudgpu, lease, one_line

OFFERS = "/api/v1/offers/"
LEASES = "/api/v1/leases/"


@pytest.fixture
def hub() -> Iterator[CannedHub]:
    with canned_hub() as running:
        yield running


def test_a_wrong_or_revoked_token_exits_3(hub: CannedHub, tmp_path: Path) -> None:
    # The hub says the same of a wrong, a revoked and a made-up token (it tells a guesser
    # nothing); tokens have no expiry of their own, a revoked one is how one stops working.
    hub.answer("GET", OFFERS, 401, {"detail": "invalid or revoked API token"})
    result = cloudgpu(tmp_path, hub.url, "offers")
    line = one_line(result, 3, "token refused by the hub: invalid or revoked API token")
    assert "cloudgpu login" in line
    assert hub.seen[0].headers["Authorization"].startswith("Bearer cgpr_")


def test_a_token_without_the_scope_exits_3_naming_it(hub: CannedHub, tmp_path: Path) -> None:
    detail = "this API token lacks the 'leases' scope that POST needs here"
    hub.answer("POST", LEASES, 403, {"detail": detail})
    result = cloudgpu(tmp_path, hub.url, "rent", "3", "--image", "busybox")
    one_line(result, 3, f"token refused by the hub: {detail}")


def test_not_logged_in_exits_3(tmp_path: Path) -> None:
    result = cloudgpu(tmp_path, "http://127.0.0.1:9", "ls", CLOUDGPU_TOKEN="")
    one_line(result, 3, "not logged in")


def test_an_unreachable_hub_exits_4(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    one_line(cloudgpu(tmp_path, url, "balance"), 4, f"hub unreachable: {url}")


def test_a_hub_that_never_answers_exits_4_after_the_timeout(hub: CannedHub, tmp_path: Path) -> None:
    hub.hang("GET", OFFERS)
    result = cloudgpu(tmp_path, hub.url, "offers", CLOUDGPU_TIMEOUT="1")
    one_line(result, 4, f"hub unreachable: {hub.url} did not answer within 1 s")


def test_a_post_that_timed_out_may_have_acted(hub: CannedHub, tmp_path: Path) -> None:
    hub.hang("POST", LEASES)
    result = cloudgpu(tmp_path, hub.url, "rent", "3", "--image", "x", CLOUDGPU_TIMEOUT="1")
    assert "check `cloudgpu ls`" in one_line(result, 4, "hub unreachable")


def test_a_bad_timeout_setting_is_a_usage_error(tmp_path: Path) -> None:
    result = cloudgpu(tmp_path, "http://127.0.0.1:9", "ls", CLOUDGPU_TIMEOUT="soon")
    one_line(result, 2, "CLOUDGPU_TIMEOUT must be seconds")


@pytest.mark.parametrize(
    ("status", "body", "start"),
    [
        (500, {"detail": "A server error occurred."}, "hub error 500: A server error occurred."),
        (503, {"detail": "the database is unreachable"}, "hub error 503: the database"),
        # A proxy in front of the hub answering with its own page.
        (502, "<html><body>Bad Gateway</body></html>", "hub error 502: HTTP 502"),
    ],
)
def test_a_hub_error_exits_5(
    hub: CannedHub, tmp_path: Path, status: int, body: object, start: str
) -> None:
    hub.answer("GET", "/api/v1/account/", status, body)
    one_line(cloudgpu(tmp_path, hub.url, "balance"), 5, start)


def test_an_answer_that_is_not_json_exits_5(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("GET", "/api/v1/account/", 200, "<html>a captive portal</html>")
    one_line(cloudgpu(tmp_path, hub.url, "balance"), 5, "hub error: ")


def test_a_price_raised_above_max_price_is_one_line_and_exit_1(
    hub: CannedHub, tmp_path: Path
) -> None:
    detail = (
        "the price changed: these GPUs now cost $0.60 an hour, more than the $0.50 you agreed"
        " to; rent again to accept the new price"
    )
    hub.answer(
        "POST",
        LEASES,
        409,
        {"detail": detail, "price_per_hour": "$0.60", "price_per_hour_micros": 600_000},
    )
    result = cloudgpu(tmp_path, hub.url, "rent", "3", "--image", "busybox", "--max-price", "0.5")
    one_line(result, 1, detail)
    assert hub.bodies("POST", LEASES) == [
        {"gpu_ids": [3], "image": "busybox", "max_price_per_hour": "0.5"}
    ]


def test_out_of_funds_is_one_line_and_exit_1(hub: CannedHub, tmp_path: Path) -> None:
    detail = "out of funds: add funds to rent (balance $0.00, the first hour costs $0.50)"
    hub.answer("POST", LEASES, 400, {"detail": detail})
    one_line(cloudgpu(tmp_path, hub.url, "rent", "3", "--image", "busybox"), 1, detail)


def test_bad_input_the_hub_refuses_names_its_field(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer(
        "POST",
        LEASES,
        400,
        {"detail": "gpus: not a selection", "errors": {"gpus": ["not a selection"]}},
    )
    result = cloudgpu(tmp_path, hub.url, "rent", "--gpus", "two", "--image", "b")
    one_line(result, 1, "gpus: not a selection")


def test_a_failed_rental_exits_1_after_saying_why(hub: CannedHub, tmp_path: Path) -> None:
    hub.answer("POST", LEASES, 201, lease("failed", failure_reason="image not found"))
    result = cloudgpu(tmp_path, hub.url, "rent", "3", "--image", "nope")
    assert result.returncode == 1
    assert "failed image not found" in result.stdout


def test_a_lease_not_yours_exits_1(hub: CannedHub, tmp_path: Path) -> None:
    one_line(cloudgpu(tmp_path, hub.url, "show", "abc"), 1, "Not found.")
