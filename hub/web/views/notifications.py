"""The account's notifications page (low-balance threshold, email choices, webhook endpoints
and their delivery logs) and the unsubscribe page an email links to. Every endpoint is looked
up with the signed-in account in the filter, so another account's id answers 404."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from hub.accounts.models import User
from hub.notifications import emails, endpoints
from hub.notifications.kinds import KINDS, Kind
from hub.notifications.models import WebhookEndpoint
from hub.web.notification_forms import (
    EmailForm,
    EndpointForm,
    EndpointUpdateForm,
    LowBalanceForm,
    mute_email,
    muted_kinds,
)

AUDIENCES = (
    ("renter", "Renting"),
    ("supplier", "Supplying"),
    ("everyone", "Account security"),
)
DELIVERY_LOG_ROWS = 20

# (group label, [(kind, checked, locked)]): a locked kind is always on (security email).
KindGroups = list[tuple[str, list[tuple[Kind, bool, bool]]]]


def kind_groups(checked: set[str], *, lock_unmutable: bool = False) -> KindGroups:
    def row(kind: Kind) -> tuple[Kind, bool, bool]:
        locked = lock_unmutable and not kind.can_mute
        return kind, locked or kind.name in checked, locked

    return [
        (label, [row(k) for k in KINDS.values() if k.audience == audience])
        for audience, label in AUDIENCES
    ]


def _user(request: HttpRequest) -> User:
    user = request.user
    assert isinstance(user, User)  # login_required ran first
    return user


def _page(
    request: HttpRequest,
    *,
    low_balance_form: LowBalanceForm | None = None,
    email_form: EmailForm | None = None,
    endpoint_form: EndpointForm | None = None,
    new_secret: tuple[WebhookEndpoint, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    user = _user(request)
    low_balance_form = low_balance_form or LowBalanceForm(initial=LowBalanceForm.initial_for(user))
    if email_form is not None and email_form.is_bound:
        emailed = set(email_form["emailed"].value() or ())
    else:
        emailed = set(KINDS) - set(muted_kinds(user))
    endpoint_form = endpoint_form or EndpointForm()
    rows: list[dict[str, Any]] = []
    # MAX_ENDPOINTS bounds these per-endpoint queries.
    for endpoint in WebhookEndpoint.objects.filter(account=user):
        rows.append(
            {
                "endpoint": endpoint,
                "kind_groups": kind_groups(set(endpoint.kinds)),
                "deliveries": list(endpoint.deliveries.select_related("event")[:DELIVERY_LOG_ROWS]),
            }
        )
    context = {
        "low_balance_form": low_balance_form,
        "email_form": email_form,
        "email_groups": kind_groups(emailed, lock_unmutable=True),
        "endpoint_form": endpoint_form,
        "endpoint_kind_groups": kind_groups(set(endpoint_form["kinds"].value() or ())),
        "endpoints": rows,
        "max_endpoints": endpoints.MAX_ENDPOINTS,
        "delivery_log_rows": DELIVERY_LOG_ROWS,
        # Shown in this response only (never_cache); the list shows the last 4 characters.
        "new_secret": new_secret,
    }
    return render(request, "notifications/settings.html", context, status=status)


@login_required
@never_cache
@require_GET
def notifications(request: HttpRequest) -> HttpResponse:
    return _page(request)


@login_required
@never_cache
@require_POST
def low_balance(request: HttpRequest) -> HttpResponse:
    form = LowBalanceForm(request.POST)
    if not form.is_valid():
        return _page(request, low_balance_form=form, status=400)
    if form.save(_user(request)) is None:
        messages.success(request, "Low-balance notices are off.")
    else:
        messages.success(request, "Low-balance threshold saved.")
    return redirect("web:notifications")


@login_required
@never_cache
@require_POST
def email_preferences(request: HttpRequest) -> HttpResponse:
    form = EmailForm(request.POST)
    if not form.is_valid():
        return _page(request, email_form=form, status=400)
    form.save(_user(request))
    messages.success(request, "Email choices saved.")
    return redirect("web:notifications")


@login_required
@never_cache
@require_POST
def endpoint_add(request: HttpRequest) -> HttpResponse:
    form = EndpointForm(request.POST)
    if form.is_valid():
        try:
            endpoint = endpoints.add(
                _user(request),
                form.cleaned_data["url"],
                form.cleaned_data["description"],
                form.cleaned_data["kinds"],
            )
        except endpoints.EndpointError as exc:
            form.add_error("url", str(exc))
        else:
            # Rendered, not redirected: the secret must not wait in the session store.
            return _page(request, new_secret=(endpoint, endpoint.secret), status=201)
    return _page(request, endpoint_form=form, status=400)


def _endpoint(request: HttpRequest, endpoint_id: int) -> WebhookEndpoint:
    return get_object_or_404(WebhookEndpoint, pk=endpoint_id, account=_user(request))


@login_required
@never_cache
@require_POST
def endpoint_update(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    form = EndpointUpdateForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Webhook {endpoint.url} not saved: {form.errors.as_text()}")
        return redirect("web:notifications")
    try:
        endpoints.update(endpoint, **form.cleaned_data)
    except endpoints.EndpointError as exc:
        messages.error(request, f"Webhook {endpoint.url} not saved: {exc}")
    else:
        messages.success(request, f"Webhook {endpoint.url} saved.")
    return redirect("web:notifications")


@login_required
@never_cache
@require_POST
def endpoint_delete(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    deleted, _ = WebhookEndpoint.objects.filter(pk=endpoint_id, account=_user(request)).delete()
    if not deleted:
        raise Http404
    messages.success(request, "Webhook deleted, with its delivery log.")
    return redirect("web:notifications")


@login_required
@never_cache
@require_POST
def endpoint_rotate(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    secret = endpoints.rotate_secret(endpoint)
    return _page(request, new_secret=(endpoint, secret))


@login_required
@never_cache
@require_POST
def endpoint_test(request: HttpRequest, endpoint_id: int) -> HttpResponse:
    endpoint = _endpoint(request, endpoint_id)
    try:
        delivery = endpoints.send_test(endpoint)
    except endpoints.EndpointError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(
            request,
            f"Test event queued for {endpoint.url} (event {delivery.event_id}): it is tried "
            "once, within seconds; its answer shows in the delivery log below.",
        )
    return redirect("web:notifications")


# A mail client's one-click unsubscribe (RFC 8058) POSTs "List-Unsubscribe=One-Click" with no
# cookie and no CSRF token; the signed token is what authorizes it. GET only asks, so a link
# scanner that follows the URL unsubscribes no one.
@csrf_exempt
@never_cache
@require_http_methods(["GET", "POST"])
def unsubscribe(request: HttpRequest, token: str) -> HttpResponse:
    found = emails.read_unsubscribe_token(token)
    person = User.objects.filter(pk=found[0], is_active=True).first() if found else None
    if found is None or person is None:
        return render(request, "notifications/unsubscribe.html", {"invalid": True}, status=404)
    kind = KINDS[found[1]]
    if not kind.can_mute:
        # A security notice is how a person hears of a stolen session: nobody turns it off,
        # with a link or otherwise. (Its emails carry no link; older ones did.)
        context = {"person": person, "kind": kind, "refused": True}
        status = 400 if request.method == "POST" else 200
        return render(request, "notifications/unsubscribe.html", context, status=status)
    done = request.method == "POST"
    if done:
        mute_email(person, kind.name)
    context = {"person": person, "kind": kind, "done": done}
    return render(request, "notifications/unsubscribe.html", context)
