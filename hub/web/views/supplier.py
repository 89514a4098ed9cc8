"""Suppliers' pages: agent tokens and install commands, hosts and GPUs with live status,
earnings.

Every lookup is scoped to the signed-in owner: another supplier's host, GPU or token is a 404.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Count, Sum
from django.db.models.functions import TruncDate
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_http_methods, require_POST

import supplier_agent
from hub.billing import payouts
from hub.billing import services as billing
from hub.billing.models import LedgerEntry, Payout
from hub.billing.money import format_micros
from hub.catalog.offers import uptime
from hub.installer import enrollment, releases
from hub.installer.models import EnrollmentCode
from hub.leases.gpu_status import gpu_statuses
from hub.lib import disk_allowance
from hub.suppliers import services as suppliers
from hub.suppliers.models import AgentToken, Gpu, GpuSample, Host, host_label
from hub.web.forms import (
    GpuTermsForm,
    HostDefaultPriceForm,
    HostDetailsForm,
    MoneyAmountForm,
    TokenForm,
)

SPARKLINE_WINDOW = timedelta(hours=1)
SPARKLINE_POINTS = 60


def install_command(code: str) -> str:
    """The one-liner a supplier pastes on a GPU host (see hub/installer): it carries a
    single-use enrollment code, never a token, since its argument is visible to every local
    user in ``ps`` and lands in shell history and sudo's log."""
    return f"curl -fsSL {settings.HUB_PUBLIC_URL}/install.sh | sudo bash -s {code}{_pins()}"


def prompt_install_command() -> str:
    """The installer without an argument: it asks for the token on the terminal, hidden."""
    pins = _pins()
    return f"curl -fsSL {settings.HUB_PUBLIC_URL}/install.sh | sudo bash" + (
        f" -s --{pins}" if pins else ""
    )


def _pins() -> str:
    """The release keys the agent pins at install (hub/installer/releases.py), so that its
    upgrades take only releases the operator signed, not whatever the hub serves then."""
    return "".join(f" --release-key {key}" for key in releases.pinned_keys())


# --- tokens and install commands ----------------------------------------------------------


def _tokens_page(
    request: HttpRequest,
    *,
    form: TokenForm | None = None,
    enroll_form: TokenForm | None = None,
    status: int = 200,
    **shown_once: Any,
) -> HttpResponse:
    context = {
        "form": form or TokenForm(),
        "enroll_form": enroll_form or TokenForm(prefix="enroll"),
        "tokens": AgentToken.objects.filter(owner=request.user)
        .annotate(host_count=Count("hosts"))
        .order_by("-created_at"),
        "waiting_codes": EnrollmentCode.objects.filter(
            owner=request.user,
            used_at__isnull=True,
            revoked_at__isnull=True,
            expires_at__gt=timezone.now(),
        ).order_by("-created_at"),
        "code_ttl_minutes": max(1, settings.ENROLLMENT_CODE_TTL_S // 60),
        "prompt_install_command": prompt_install_command(),
        **shown_once,
    }
    return render(request, "web/tokens.html", context, status=status)


@login_required
@never_cache
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        # Shown in this response only, never kept in the session store (issue 14).
        _, new_token = suppliers.create_agent_token(request.user, form.cleaned_data["name"])
        return _tokens_page(request, status=201, new_token=new_token)
    return _tokens_page(request, form=form)


@login_required
@never_cache
@require_POST
def install_command_create(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST, prefix="enroll")
    if not form.is_valid():
        return _tokens_page(request, enroll_form=form)
    # Like a new token, the code is in this response only (never_cache: no-store).
    code, plaintext = enrollment.create_enrollment_code(request.user, form.cleaned_data["name"])
    return _tokens_page(
        request, status=201, new_code=code, install_command=install_command(plaintext)
    )


@login_required
@require_POST
def install_command_cancel(request: HttpRequest, code_id: int) -> HttpResponse:
    code = get_object_or_404(EnrollmentCode, pk=code_id, owner=request.user)
    if enrollment.revoke_enrollment_code(request.user, code.pk):
        messages.success(request, f"Install command {code.prefix}… cancelled.")
    else:
        messages.info(request, f"Install command {code.prefix}… was already used or cancelled.")
    return redirect("web:tokens")


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(AgentToken, pk=token_id, owner=request.user)
    if suppliers.revoke_agent_token(token.pk):
        messages.success(request, f"Token {token.prefix}… revoked; its agents were disconnected.")
    else:
        messages.info(request, f"Token {token.prefix}… was already revoked.")
    return redirect("web:tokens")


# --- hosts and GPUs -----------------------------------------------------------------------


def _own_hosts(request: HttpRequest) -> list[Host]:
    return list(
        Host.objects.filter(owner=request.user).prefetch_related("gpus").order_by("hostname", "pk")
    )


def _sparklines(gpu_ids: list[int]) -> dict[int, dict[str, list[float]]]:
    since = timezone.now() - SPARKLINE_WINDOW
    series: dict[int, dict[str, list[float]]] = defaultdict(lambda: {"util": [], "vram": []})
    rows = (
        GpuSample.objects.filter(gpu_id__in=gpu_ids, at__gte=since)
        .order_by("gpu_id", "at")
        .values_list("gpu_id", "utilization_pct", "memory_used_bytes", "memory_total_bytes")
    )
    for gpu_id, util, used, total in rows:
        series[gpu_id]["util"].append(util)
        series[gpu_id]["vram"].append(100 * used / total if total else 0)
    return {
        gpu_id: {name: values[-SPARKLINE_POINTS:] for name, values in s.items()}
        for gpu_id, s in series.items()
    }


def _host_rows(hosts: list[Host]) -> list[dict[str, Any]]:
    gpus = [gpu for host in hosts for gpu in host.gpus.all()]
    lines = _sparklines([gpu.pk for gpu in gpus])
    statuses = gpu_statuses(hosts)
    uptimes = uptime([host.pk for host in hosts])
    return [
        {
            "host": host,
            "gpus": [
                {
                    "gpu": gpu,
                    "status": statuses[gpu.pk],
                    "util": lines.get(gpu.pk, {}).get("util", []),
                    "vram": lines.get(gpu.pk, {}).get("vram", []),
                    "form": GpuTermsForm(
                        initial={
                            "price": gpu.price_per_hour_micros / 1_000_000,
                            "listed": gpu.listed,
                            **_shown_allowance(gpu),
                        },
                        prefix=f"gpu{gpu.pk}",
                    ),
                }
                for gpu in host.gpus.all()
            ],
            "uptime_7d": uptimes.get(host.pk, 0.0),
        }
        for host in hosts
    ]


def _hosts_context(request: HttpRequest) -> dict[str, Any]:
    return {
        "rows": _host_rows(_own_hosts(request)),
        "latest_agent": supplier_agent.__version__,
    }


@login_required
@require_GET
def hosts(request: HttpRequest) -> HttpResponse:
    return render(request, "web/hosts.html", _hosts_context(request))


@login_required
@require_GET
def hosts_panel(request: HttpRequest) -> HttpResponse:
    return render(request, "web/partials/hosts_list.html", _hosts_context(request))


@login_required
@require_GET
def host_status(request: HttpRequest, host_id: int) -> HttpResponse:
    host = get_object_or_404(Host, pk=host_id, owner=request.user)
    row = _host_rows([host])[0]
    return render(
        request,
        "web/partials/host_status.html",
        {"row": row, "latest_agent": supplier_agent.__version__},
    )


def _shown_allowance(gpu: Gpu) -> dict[str, int]:
    """The allowance as the form shows it (whole GiB): posted back unchanged, it stays as it is,
    even where the hub's default is not a whole number of GiB."""
    return {"disk_allowance_gib": gpu.disk_allowance_bytes // disk_allowance.GIB}


@login_required
@require_POST
def gpu_terms(request: HttpRequest, gpu_id: int) -> HttpResponse:
    gpu = get_object_or_404(Gpu.objects.select_related("host"), pk=gpu_id, host__owner=request.user)
    form = GpuTermsForm(request.POST, prefix=f"gpu{gpu.pk}", initial=_shown_allowance(gpu))
    if not form.is_valid():
        errors = "; ".join(str(e) for errs in form.errors.values() for e in errs)
        messages.error(request, f"GPU {gpu.index} on {gpu.host.label} unchanged: {errors}")
        return redirect("web:hosts")
    try:
        gpu = suppliers.set_gpu_terms(
            gpu.pk,
            price_per_hour_micros=form.price_micros,
            listed=form.cleaned_data["listed"],
            disk_allowance_bytes=form.disk_allowance_bytes,
        )
    except suppliers.SupplierError as exc:
        messages.error(request, f"GPU {gpu.index} on {gpu.host.label} unchanged: {exc}")
    else:
        messages.success(
            request,
            f"GPU {gpu.index} on {gpu.host.label}: "
            f"{format_micros(form.price_micros, cents=True)}/h, "
            f"{disk_allowance.words(gpu.disk_allowance_bytes)} of disk per rental, "
            + ("for rent." if form.cleaned_data["listed"] else "not for rent."),
        )
    return redirect("web:hosts")


@login_required
@require_POST
def host_default_price(request: HttpRequest, host_id: int) -> HttpResponse:
    host = get_object_or_404(Host, pk=host_id, owner=request.user)
    form = HostDefaultPriceForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(str(e) for errs in form.errors.values() for e in errs)
        messages.error(request, f"{host.label} unchanged: {errors}")
        return redirect("web:hosts")
    try:
        suppliers.set_host_default_price(host.pk, form.price_micros)
    except suppliers.SupplierError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"GPUs {host.label} adds later are listed at "
            f"{format_micros(form.price_micros, cents=True)}/h."
            if form.price_micros is not None
            else f"GPUs {host.label} adds later stay unlisted until you price them.",
        )
    return redirect("web:hosts")


@login_required
@require_POST
def host_maintenance(request: HttpRequest, host_id: int) -> HttpResponse:
    host = get_object_or_404(Host, pk=host_id, owner=request.user)
    on = request.POST.get("maintenance") == "on"
    suppliers.set_host_maintenance(host.pk, on)
    messages.success(
        request,
        f"{host.label} is in maintenance: no new rentals; running ones go on."
        if on
        else f"{host.label} takes rentals again.",
    )
    return redirect("web:hosts")


@login_required
@require_POST
def host_details(request: HttpRequest, host_id: int) -> HttpResponse:
    host = get_object_or_404(Host, pk=host_id, owner=request.user)
    form = HostDetailsForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(str(e) for errs in form.errors.values() for e in errs)
        messages.error(request, f"{host.label} unchanged: {errors}")
        return redirect("web:hosts")
    try:
        host = suppliers.set_host_details(
            host.pk, name=form.cleaned_data["name"], location=form.cleaned_data["location"]
        )
    except suppliers.SupplierError as exc:
        messages.error(request, f"{host.label} unchanged: {exc}.")
        return redirect("web:hosts")
    messages.success(
        request,
        f"Host {host.label} saved"
        + (f", in {host.location}." if host.location else ", no location given."),
    )
    return redirect("web:hosts")


# --- earnings -----------------------------------------------------------------------------


def _earnings_context(
    request: HttpRequest, payout_form: MoneyAmountForm | None = None
) -> dict[str, Any]:
    rows = LedgerEntry.objects.filter(account=request.user, kind=LedgerEntry.Kind.EARNING)
    per_day = (
        rows.annotate(day=TruncDate("created_at"))
        .values("day")
        .annotate(total=Sum("amount_micros"))
        .order_by("-day")[:60]
    )
    per_lease = (
        rows.values(
            "lease_id",
            "lease__host__hostname",
            "lease__host__name",
            "lease__host__agent_id",
            "lease__state",
            "lease__created_at",
        )
        .annotate(total=Sum("amount_micros"))
        .order_by("-lease__created_at")[:100]
    )
    per_lease = [
        {
            **row,
            "host_label": host_label(
                row["lease__host__name"], row["lease__host__hostname"], row["lease__host__agent_id"]
            ),
        }
        for row in per_lease
    ]
    context = {
        "total_micros": rows.aggregate(total=Sum("amount_micros"))["total"] or 0,
        "balance_micros": billing.balance_micros(request.user),
        "per_day": per_day,
        "per_lease": per_lease,
        "payable_micros": payouts.payable_micros(request.user),
        "held_micros": payouts.held_micros(request.user),
        "payout_minimum_micros": settings.PAYOUT_MINIMUM_MICROS,
        "payout_form": payout_form or MoneyAmountForm(prefix="payout"),
        "payouts": Payout.objects.filter(account=request.user)[:50],
    }
    return context


@login_required
@require_GET
def earnings(request: HttpRequest) -> HttpResponse:
    return render(request, "web/earnings.html", _earnings_context(request))


@login_required
@require_POST
def payout_request(request: HttpRequest) -> HttpResponse:
    form = MoneyAmountForm(request.POST, prefix="payout")
    if form.is_valid():
        try:
            payouts.request_payout(request.user, form.amount_micros)
        except billing.BillingError as exc:
            form.add_error(None, f"{str(exc)[:1].upper()}{str(exc)[1:]}.")
        else:
            messages.success(
                request,
                f"Payout of {format_micros(form.amount_micros, cents=True)} requested; an admin "
                "sends it and marks it paid here.",
            )
            return redirect("web:earnings")
    return render(request, "web/earnings.html", _earnings_context(request, form), status=400)


@login_required
@require_POST
def payout_cancel(request: HttpRequest, payout_id: int) -> HttpResponse:
    payout = get_object_or_404(Payout, pk=payout_id, account=request.user)
    if payouts.cancel_payout(payout.pk, request.user):
        messages.success(request, "Payout request cancelled; the money is payable again.")
    else:
        messages.info(request, "That payout was already paid or cancelled.")
    return redirect("web:earnings")
