from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest
from rest_framework.test import APIClient

from hub.accounts.api_tokens import create_api_token
from hub.accounts.models import DEFAULT_API_SCOPES, User
from hub.billing import services as billing
from tests.hub import factories as f


@pytest.fixture(autouse=True)
def liveness_set() -> Iterator[str]:
    with f.private_liveness_set() as key:
        yield key


@pytest.fixture
def renter() -> User:
    return f.make_user("renter")


def client_for(user: User, scopes: Iterable[str] = DEFAULT_API_SCOPES) -> APIClient:
    """A client with a new token of ``user``'s: the default scopes unless told otherwise."""
    client = APIClient()
    _, plaintext = create_api_token(user, "tests", scopes)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


@pytest.fixture
def api(renter: User) -> APIClient:
    return client_for(renter)


def top_up(user: User, micros: int) -> None:
    billing.adjust(user, micros, "test top-up", by=f.make_user("admin", is_staff=True))
