"""One limiter for every login form, keyed on what Django logs in as; sign-ups throttled."""

from __future__ import annotations

import unicodedata
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from hub.web import ratelimit
from tests.hub import factories as f

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple 42"
ADDRESS = f"10.99.{uuid.uuid4().int % 250}.{uuid.uuid4().int % 250}"


@pytest.fixture
def victim() -> Iterator[Any]:
    user = f.make_user("victim", is_staff=True, is_superuser=True)
    user.set_password(PASSWORD)
    user.save()
    yield user
    ratelimit.clear(user.username, ADDRESS)
    cache.close()


def _fullwidth(text: str) -> str:
    # ASCII letters and digits to their fullwidth forms (NFKC maps them back).
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in text)


def test_the_admin_login_is_rate_limited_like_the_dashboards(settings: Any, victim: Any) -> None:
    client = Client(REMOTE_ADDR=ADDRESS)
    for _ in range(settings.LOGIN_RATE_LIMIT):
        client.post("/admin/login/", {"username": victim.username, "password": "wrong"})

    right = client.post("/admin/login/", {"username": victim.username, "password": PASSWORD})

    assert right.status_code == 429  # the right password too, while locked out
    assert "Too many failed log-in attempts" in right.content.decode()
    # The dashboard's form shares the counter.
    login = client.post(reverse("web:login"), {"username": victim.username, "password": PASSWORD})
    assert login.status_code == 429


def test_look_alike_usernames_share_the_real_ones_counter(settings: Any, victim: Any) -> None:
    look_alike = _fullwidth(victim.username.upper())
    assert look_alike != victim.username
    assert unicodedata.normalize("NFKC", look_alike).casefold() == victim.username.casefold()
    client = Client(REMOTE_ADDR=ADDRESS)
    for _ in range(settings.LOGIN_RATE_LIMIT):
        client.post(reverse("web:login"), {"username": look_alike, "password": "wrong"})

    right = client.post(reverse("web:login"), {"username": victim.username, "password": PASSWORD})

    assert right.status_code == 429


def test_sign_up_refuses_a_name_that_is_taken_in_another_form() -> None:
    existing = f.make_user("taken")
    look_alike = _fullwidth(existing.username.upper())
    client = Client(REMOTE_ADDR=f"10.98.{uuid.uuid4().int % 250}.1")

    response = client.post(
        reverse("web:signup"),
        {"username": look_alike, "password1": PASSWORD, "password2": PASSWORD},
    )

    assert response.status_code == 400
    assert "That username is taken." in response.content.decode()


def test_sign_ups_are_throttled_per_address(settings: Any) -> None:
    settings.SIGNUP_RATE_LIMIT = 2
    client = Client(REMOTE_ADDR=f"10.97.{uuid.uuid4().int % 250}.1")

    def sign_up() -> int:
        name = f"n{uuid.uuid4().hex[:8]}"
        data = {"username": name, "password1": PASSWORD, "password2": PASSWORD}
        fresh = Client(REMOTE_ADDR=client.defaults["REMOTE_ADDR"])
        return fresh.post(reverse("web:signup"), data).status_code

    assert [sign_up(), sign_up()] == [302, 302]
    assert sign_up() == 429
