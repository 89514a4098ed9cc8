"""Hostile request bodies get a 4xx in the API's JSON shape, before their size costs anything."""

from __future__ import annotations

import json

import pytest
from rest_framework.test import APIClient

from hub.api.parsers import MAX_JSON_DEPTH, json_depth_exceeds

pytestmark = pytest.mark.django_db


def _post(api: APIClient, body: str | bytes) -> object:
    return api.post("/api/v1/leases/", data=body, content_type="application/json")


@pytest.mark.parametrize("depth", [5000, 100, MAX_JSON_DEPTH + 1])
def test_a_deeply_nested_body_is_a_json_400(api: APIClient, depth: int) -> None:
    response = _post(api, "[" * depth + "]" * depth)

    assert response.status_code == 400  # type: ignore[attr-defined]
    assert response["content-type"] == "application/json"  # type: ignore[index]
    assert "nested more than 32 levels" in response.json()["detail"]  # type: ignore[attr-defined]


def test_an_ordinary_nesting_still_reaches_the_view(api: APIClient) -> None:
    body = json.dumps({"image": "busybox", "env": {"A": "b"}, "ports": [8080], "gpus": 1})

    response = _post(api, body)

    # Refused for what it says (no such offer), not for its shape.
    assert response.status_code == 400  # type: ignore[attr-defined]
    assert "nested" not in response.json()["detail"]  # type: ignore[attr-defined]


def test_an_oversized_body_is_413_json(api: APIClient, settings: object) -> None:
    response = _post(api, b'{"image": "' + b"x" * (10 * 1024 * 1024) + b'"}')

    assert response.status_code == 413  # type: ignore[attr-defined]
    assert response["content-type"] == "application/json"  # type: ignore[index]
    assert "over the API's limit" in response.json()["detail"]  # type: ignore[attr-defined]


def test_depth_is_measured_without_recursion() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    assert json_depth_exceeds(deep, 32)
    assert not json_depth_exceeds({"a": [{"b": 1}]}, 3)
    assert json_depth_exceeds({"a": [{"b": []}]}, 3)
