"""The front page: what the market has right now, and where to go next."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from hub.catalog.offers import market_summary


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    count, cheapest = market_summary()
    return render(request, "home.html", {"offer_count": count, "cheapest": cheapest})
