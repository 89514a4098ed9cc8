"""Issue 34 item 7: the API schema is built once per process, under a lock, and served from
memory, so concurrent first requests cannot race drf-spectacular's lazy loading."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.test import Client

from hub.api.schema_view import CachedSchemaView

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def fresh_schema() -> Iterator[None]:
    CachedSchemaView.forget()
    yield
    CachedSchemaView.forget()


def test_sixteen_concurrent_first_requests_build_it_once_and_all_get_it(
    fresh_schema: None,
) -> None:
    before = CachedSchemaView.builds
    start = threading.Barrier(16)
    answers: list[tuple[int, bytes]] = []
    lock = threading.Lock()

    def fetch() -> None:
        client = Client()
        start.wait(timeout=30)  # all 16 ask at once
        response = client.get("/api/schema/?format=json")
        with lock:
            answers.append((response.status_code, response.content))

    threads = [threading.Thread(target=fetch) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert [status for status, _ in answers] == [200] * 16
    assert len({body for _, body in answers}) == 1
    assert CachedSchemaView.builds == before + 1


def test_the_cached_schema_is_the_full_one_in_both_formats(fresh_schema: None) -> None:
    client = Client()
    as_json = client.get("/api/schema/?format=json")
    assert as_json.status_code == 200
    paths = as_json.json()["paths"]
    assert "/api/v1/leases/" in paths
    assert "/api/schema/" not in paths  # the schema view describes the API, not itself
    as_yaml = client.get("/api/schema/")
    assert as_yaml.status_code == 200
    assert b"openapi: 3" in as_yaml.content
    assert 'filename="CloudGPU API.yaml"' in as_yaml["Content-Disposition"]
