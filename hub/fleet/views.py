"""The fleet page at /admin/fleet/: staff only; anyone else is sent to the admin login. It also
starts, pauses, resumes and aborts agent rollouts (hub/rollouts)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

import supplier_agent
from hub.fleet.services import RECENT, fleet_summary
from hub.installer import releases
from hub.rollouts import services as rollouts
from hub.rollouts import summary as rollout_summary


@staff_member_required
def fleet(request: HttpRequest) -> HttpResponse:
    try:
        served = releases.served_version()
    except releases.ReleaseError:
        served = ""
    context = {
        **admin.site.each_context(request),
        "title": "Fleet",
        "fleet": fleet_summary(),
        "recent_hours": int(RECENT.total_seconds() // 3600),
        "hub_agent_version": supplier_agent.__version__,
        "rollout": rollout_summary.latest(),
        "served_version": served,
    }
    return render(request, "fleet/fleet.html", context)


@staff_member_required
@require_POST
def rollout_create(request: HttpRequest) -> HttpResponse:
    # Staff see the fleet; moving all of it takes the permission to add rollouts.
    if not request.user.has_perm("rollouts.add_rollout"):
        raise PermissionDenied("starting a rollout takes the permission to add rollouts")
    form = request.POST
    try:
        pause_s = int(form.get("pause_s") or 600)
        if not 0 <= pause_s <= 7 * 86400:
            raise rollouts.RolloutError("pause: from 0 s to a week")
        rollout = rollouts.create(
            rollouts.parse_percents(form.get("waves", "")),
            named=rollouts.find_hosts(form.get("first_hosts", "")),
            pause_s=pause_s,
            force=form.get("force") == "on",
            by=request.user,
        )
    except ValueError as exc:  # RolloutError, and int() of a pause that is not a number
        messages.error(
            request,
            str(exc) if isinstance(exc, rollouts.RolloutError) else "pause: a number of seconds",
        )
    else:
        messages.success(request, f"Rollout of {rollout.version} started.")
    return redirect("fleet:fleet")


ACTIONS: dict[str, Any] = {
    "pause": lambda pk, user: rollouts.pause(pk, f"paused by {user}"),
    "resume": lambda pk, user: rollouts.resume(pk),
    "abort": lambda pk, user: rollouts.abort(pk, f"aborted by {user}"),
}


@staff_member_required
@require_POST
def rollout_action(request: HttpRequest, rollout_id: Any, action: str) -> HttpResponse:
    if action not in ACTIONS:
        raise Http404("no such action")
    if not request.user.has_perm("rollouts.change_rollout"):
        raise PermissionDenied("steering a rollout takes the permission to change rollouts")
    try:
        rollout = ACTIONS[action](rollout_id, request.user)
    except rollouts.RolloutError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Rollout of {rollout.version}: {rollout.state}.")
    return redirect("fleet:fleet")
