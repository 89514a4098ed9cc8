"""Renters' pages: offers, renting, a lease's live page, history and usage."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from redis.exceptions import RedisError

from hub.billing import services as billing
from hub.billing import topups
from hub.billing.models import LedgerEntry, TopUpRequest
from hub.billing.money import format_micros
from hub.catalog.models import Template
from hub.catalog.offers import list_offers, uptime
from hub.catalog.services import with_account_keys
from hub.leases import gpu_choice
from hub.leases import logs as lease_logs
from hub.leases import services as leases
from hub.leases.models import Lease
from hub.lib.gpu_select import GpuSelection
from hub.suppliers.models import Gpu, Host
from hub.tunnels import access, renter_ssh
from hub.tunnels import services as tunnels
from hub.volumes import services as volumes
from hub.volumes.models import Volume
from hub.web.forms import OfferFilterForm, RentForm, TopUpRequestForm
from hub.web.views import benchmarks as benchmark_views

OFFERS_PER_PAGE = 100


def _is_htmx(request: HttpRequest) -> bool:
    return request.headers.get("HX-Request") == "true"


@require_GET
def offers(request: HttpRequest) -> HttpResponse:
    form = OfferFilterForm(request.GET or None)
    page = (form.cleaned_data.get("page") if form.is_valid() else None) or 1
    found = list_offers(
        **form.filters(), limit=OFFERS_PER_PAGE + 1, offset=(page - 1) * OFFERS_PER_PAGE
    )
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "form": form,
        "offers": found[:OFFERS_PER_PAGE],
        "page": page,
        "next_page": page + 1 if len(found) > OFFERS_PER_PAGE else None,
        "previous_page": page - 1 if page > 1 else None,
        "query": query.urlencode(),
    }
    if _is_htmx(request):
        return render(request, "web/partials/offers_table.html", context)
    return render(request, "web/offers.html", context)


def _rentable(gpu_id: int) -> Gpu:
    return get_object_or_404(
        Gpu.objects.select_related("host"), pk=gpu_id, listed=True, priced=True, present=True
    )


@login_required
@require_http_methods(["GET", "POST"])
def rent(request: HttpRequest, gpu_id: int) -> HttpResponse:
    gpu = _rentable(gpu_id)
    own_volumes = Volume.objects.filter(
        renter=request.user, host=gpu.host, kind=Volume.Kind.VOLUME, state=Volume.State.ACTIVE
    )
    form = RentForm(request.POST or None, volumes=own_volumes)
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                spec = with_account_keys(form.spec, form.cleaned_data["template"], request.user)
                if form.cleaned_data.get("volume"):
                    path = form.cleaned_data.get("volume_path") or "/data"
                    mounts = volumes.mounts_for_lease(
                        request.user, gpu.host, [(form.cleaned_data["volume"].pk, path)]
                    )
                    spec = dataclasses.replace(spec, volumes=volumes.wire_mounts(mounts))
                selection = form.cleaned_data["gpus"] or GpuSelection(
                    "indices", indices=(gpu.index,)
                )
                # The price shown is this GPU's: it bounds a rental of this GPU alone.
                alone = selection == GpuSelection("indices", indices=(gpu.index,))
                lease = gpu_choice.start_lease_on(
                    request.user,
                    selection,
                    spec,
                    host=gpu.host,
                    max_price_per_hour_micros=(
                        form.cleaned_data["seen_price_micros"] if alone else None
                    ),
                )
            except leases.PriceChanged as exc:
                form.add_error(None, _sentence(str(exc)))
                gpu.price_per_hour_micros = exc.price_per_hour_micros
            except (leases.LeaseError, volumes.VolumeError) as exc:
                form.add_error(None, _sentence(str(exc)))
            else:
                messages.success(request, "Rental started. It is being set up on the host.")
                return redirect("web:lease", lease_id=lease.pk)
        status = 400
    context = {
        "form": form,
        "gpu": gpu,
        "host": gpu.host,
        "host_online": gpu.host.status == Host.Status.ONLINE and not gpu.host.maintenance,
        "uptime_7d": uptime([gpu.host_id]).get(gpu.host_id, 0.0),
        "templates": Template.objects.filter(listed=True),
        "template_fills": _template_fills(),
    }
    return render(request, "web/rent.html", context, status=status)


def _template_fills() -> dict[str, dict[str, str]]:
    """What choosing each template writes into the rent form (web/static/web/forms.js), in
    the form's own notation, so the renter sees and can edit what will run; submitted
    unchanged, it is the template's own spec (RentForm reads it back to the same values)."""
    return {
        str(t.pk): {
            "image": t.image,
            "ports": ", ".join(str(p) for p in t.ports or []),
            "env": "\n".join(f"{name}={value}" for name, value in (t.env or {}).items()),
            "command": shlex.join(t.command) if t.command else "",
            "warmup": shlex.join(t.warmup) if t.warmup else "",
        }
        for t in Template.objects.filter(listed=True)
    }


def _sentence(text: str) -> str:
    text = text.strip()
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else text


def _own_lease(request: HttpRequest, lease_id: Any) -> Lease:
    # Someone else's lease is a 404, exactly like one that does not exist.
    return get_object_or_404(Lease.objects.select_related("host"), pk=lease_id, renter=request.user)


def _lease_context(lease: Lease) -> dict[str, Any]:
    urls = [
        {
            "port": t.container_port,
            "url": tunnels.public_url(t),
            "state": t.state,
            "detail": t.detail,
        }
        for t in lease.tunnels.all()
    ]
    kept_output = ""
    if not lease.active and not lease.log_tail:
        # A rental stopped (not exited) has no exit tail; the live output the hub kept for
        # late viewers is what it printed, for LOG_BACKLOG_AFTER_END_S after the end.
        try:
            kept_output = lease_logs.backlog_text(str(lease.pk))
        except RedisError:
            kept_output = ""
    return {
        "lease": lease,
        "kept_output": kept_output,
        "urls": urls,
        "gpus": list(lease.gpus.order_by("index")),
        "show_urls": lease.state in (Lease.State.STARTING, Lease.State.RUNNING),
        # web/partials/lease_ssh.html: ssh -J / -L through the gateway (hub/tunnels/renter_ssh.py)
        "ssh": renter_ssh.lease_access(lease),
        "has_ssh_keys": lease.renter.ssh_keys.exists(),
        "warmup": shlex.join(lease.warmup) if lease.warmup else "",
        **benchmark_views.panel_context(lease),
    }


@login_required
@require_GET
def lease_detail(request: HttpRequest, lease_id: Any) -> HttpResponse:
    lease = _own_lease(request, lease_id)
    return render(request, "web/lease.html", _lease_context(lease))


@login_required
@never_cache
@require_POST
def lease_access_token(request: HttpRequest, lease_id: Any) -> HttpResponse:
    """A new access token for a protected lease's URLs, in this response only: never kept in
    the session store (issue 14); the renter can ask for another any time."""
    lease = _own_lease(request, lease_id)
    context = _lease_context(lease)
    if lease.access_protected and lease.active:
        context["access_token"] = access.issue(lease.pk)
    return render(request, "web/lease.html", context)


@login_required
@require_GET
def lease_panel(request: HttpRequest, lease_id: Any) -> HttpResponse:
    lease = _own_lease(request, lease_id)
    return render(request, "web/partials/lease_panel.html", _lease_context(lease))


@login_required
@require_POST
def lease_stop(request: HttpRequest, lease_id: Any) -> HttpResponse:
    lease = _own_lease(request, lease_id)
    if lease.state in (
        Lease.State.PENDING,
        Lease.State.RESERVING,
        Lease.State.STARTING,
        Lease.State.RUNNING,
    ):
        leases.release_lease(lease.pk, Lease.EndReason.RENTER_STOP)
        messages.success(
            request, "Stopping your rental. Billing has stopped; the host is removing it."
        )
    else:
        messages.info(request, "This rental is already stopping or over.")
    return redirect("web:lease", lease_id=lease.pk)


@login_required
@require_GET
def lease_list(request: HttpRequest) -> HttpResponse:
    rows = Lease.objects.filter(renter=request.user).select_related("host")[:200]
    return render(request, "web/leases.html", {"leases": rows})


def _usage_context(
    request: HttpRequest, topup_form: TopUpRequestForm | None = None
) -> dict[str, Any]:
    user = request.user
    rows = list(Lease.objects.filter(renter=user).select_related("host")[:200])
    charged = Lease.objects.filter(renter=user).aggregate(total=Sum("charged_micros"))["total"]
    going = [lease for lease in rows if lease.active]
    context = {
        "balance_micros": billing.balance_micros(user),
        "total_charged_micros": charged or 0,
        "burn_per_hour_micros": sum(lease.price_per_hour_micros for lease in going),
        "leases": rows,
        "credits": LedgerEntry.objects.filter(
            account=user,
            kind__in=[LedgerEntry.Kind.ADJUSTMENT, LedgerEntry.Kind.PAYMENT],
        )[:50],
        "topup_form": topup_form or TopUpRequestForm(prefix="topup"),
        "topup_requests": TopUpRequest.objects.filter(account=user)[:20],
    }
    return context


@login_required
@require_GET
def usage(request: HttpRequest) -> HttpResponse:
    return render(request, "web/usage.html", _usage_context(request))


@login_required
@require_POST
def top_up_request(request: HttpRequest) -> HttpResponse:
    """No payment processor is wired in yet: the renter asks, an admin adds the money from
    the person's admin page (hub/billing/topups.py)."""
    form = TopUpRequestForm(request.POST, prefix="topup")
    if form.is_valid():
        try:
            topups.request_top_up(request.user, form.amount_micros, form.cleaned_data["note"])
        except billing.BillingError as exc:
            form.add_error(None, _sentence(str(exc)))
        else:
            messages.success(
                request,
                f"Asked for {format_micros(form.amount_micros, cents=True)}. An admin adds it to "
                "your balance; it shows here when they do.",
            )
            return redirect("web:usage")
    return render(request, "web/usage.html", _usage_context(request, form), status=400)
