"""Issue 38 item 1: offers at fleet scale. Every filter runs in SQL, so pages are pages: the
API's limit, offset and Link header, the offers page's pager, GPUs free together on one host
(num_gpus) with their total price, CUDA compared as numbers, uptime from the refreshed column.
The figure at 10,000 hosts is bench/offers_scale.py's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from hub.accounts.models import User
from hub.catalog import offers
from hub.lib.versions import version_number
from hub.suppliers.models import Gpu, Host
from hub.web.views import renter as renter_views
from tests.hub import factories as f
from tests.hub.api.conftest import top_up

pytestmark = pytest.mark.django_db


def _host(gpus: int, price_micros: int, cuda: str = "12.4") -> Host:
    host = f.register_host(gpus=tuple(range(gpus)))
    Gpu.objects.filter(host=host).update(price_per_hour_micros=price_micros)
    Host.objects.filter(pk=host.pk).update(cuda_version=cuda, cuda_key=version_number(cuda))
    return host


def _gpu_ids(response: Any) -> list[int]:
    assert response.status_code == 200, response.content
    return [o["gpu_id"] for o in response.json()]


def _walk(api: APIClient, url: str) -> tuple[list[int], list[str]]:
    """Every page from ``url`` by the Link headers: the GPU ids in order, and the links."""
    seen, links = [], []
    while url:
        response = api.get(url)
        seen += _gpu_ids(response)
        link = response.get("Link", "")
        url = link[1 : link.index(">")] if link else ""
        if url:
            assert link.endswith('rel="next"')
            links.append(url)
    return seen, links


@pytest.mark.parametrize(
    ("sort", "paged_by"),
    [("price", "after="), ("-price", "after="), ("model", "after="), ("vram", "offset=")],
)
def test_the_api_pages_offers_with_a_link_to_the_next(
    api: APIClient, sort: str, paged_by: str
) -> None:
    for price in (300_000, 100_000, 200_000, 100_000):
        _host(2, price)
    everything = _gpu_ids(api.get(f"/api/v1/offers/?sort={sort}"))
    assert len(everything) == 8
    seen, links = _walk(api, f"/api/v1/offers/?limit=3&model=&sort={sort}")
    assert seen == everything  # in order, none twice, none lost (ties on price included)
    assert len(links) == 2
    for link in links:
        assert paged_by in link
        assert "model=" in link  # the filters travel with it


def test_a_cursor_that_is_not_one_is_a_400(api: APIClient) -> None:
    _host(2, 100_000)
    for query, words in [
        ("?after=bm90LWpzb24", "not a cursor"),
        ("?after=WzEsMl0&sort=model", "not a cursor of this sort"),
        ("?after=WzEsMl0&sort=vram", "pages by offset"),
        ("?after=WzEsMl0&offset=3", "not both"),
        ("?limit=1001", "1000"),
        ("?offset=-1", "0"),
    ]:
        response = api.get(f"/api/v1/offers/{query}")
        assert response.status_code == 400, query
        assert words in json.dumps(response.json()), (query, response.json())


def test_num_gpus_keeps_hosts_with_that_many_free_together_and_totals_the_price(
    api: APIClient, renter: User
) -> None:
    four = _host(4, 500_000)
    one = _host(1, 100_000)
    two = _host(2, 200_000)
    # One of the four is rented: three are free together.
    top_up(renter, 10_000_000)
    lease = f.start_lease(four, [0], renter=renter)
    assert lease.pk
    response = api.get("/api/v1/offers/?num_gpus=3")
    rows = response.json()
    assert {r["host_id"] for r in rows} == {four.pk}
    assert len(rows) == 3
    assert {(r["num_gpus"], r["total_price_per_hour_micros"]) for r in rows} == {(3, 1_500_000)}
    assert {r["host_id"] for r in api.get("/api/v1/offers/?num_gpus=2").json()} == {
        four.pk,
        two.pk,
    }
    # Together with the other filters: under $0.30 only the 2-GPU host has two.
    assert {r["host_id"] for r in api.get("/api/v1/offers/?num_gpus=2&max_price=0.3").json()} == {
        two.pk
    }
    assert one.pk in {r["host_id"] for r in api.get("/api/v1/offers/").json()}
    assert api.get("/api/v1/offers/?num_gpus=0").status_code == 400


def test_cuda_compares_as_numbers_and_an_unknown_one_never_passes(api: APIClient) -> None:
    newer, older, unknown = _host(1, 1, "12.10"), _host(1, 1, "12.9"), _host(1, 1, "")
    assert version_number("12.10") > version_number("12.9") > version_number("12") > 0
    assert version_number("") == version_number("abc") == 0
    hosts = {r["host_id"] for r in api.get("/api/v1/offers/?min_cuda=12.10").json()}
    assert hosts == {newer.pk}
    hosts = {r["host_id"] for r in api.get("/api/v1/offers/?min_cuda=12").json()}
    assert hosts == {newer.pk, older.pk}
    assert unknown.pk not in hosts


def test_the_offers_page_has_a_pager_that_keeps_the_filters(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(renter_views, "OFFERS_PER_PAGE", 2)
    _host(3, 100_000)
    first = client.get("/offers/?sort=price&num_gpus=1").content.decode()
    assert 'rel="next"' in first
    assert "sort=price&amp;num_gpus=1&amp;page=2" in first
    last = client.get("/offers/?sort=price&num_gpus=1&page=2").content.decode()
    assert 'rel="next"' not in last
    assert 'rel="prev"' in last
    assert last.count("data-gpu=") == 1


def test_the_front_page_counts_the_market_without_listing_it(client: Client) -> None:
    _host(3, 250_000)
    _host(1, 90_000)
    count, cheapest = offers.market_summary()
    assert count == 4
    assert cheapest is not None
    assert cheapest.price_per_hour_micros == 90_000
    assert client.get("/").status_code == 200
