"""The fleet page at /admin/fleet/: staff only; anyone else is sent to the admin login."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

import supplier_agent
from hub.fleet.services import RECENT, fleet_summary


@staff_member_required
def fleet(request: HttpRequest) -> HttpResponse:
    context = {
        **admin.site.each_context(request),
        "title": "Fleet",
        "fleet": fleet_summary(),
        "recent_hours": int(RECENT.total_seconds() // 3600),
        "hub_agent_version": supplier_agent.__version__,
    }
    return render(request, "fleet/fleet.html", context)
