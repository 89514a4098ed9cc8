"""Admin for money: the ledger is read-only (rows are written only by services), and balances
are changed with the "Adjust balance" action on users, which records a reason and the admin."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth.admin import UserAdmin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from hub.accounts.models import User
from hub.billing import payouts, services, topups
from hub.billing.forms import AdjustBalanceForm, MarkPaidForm
from hub.billing.models import LedgerEntry, Payout, TopUpRequest
from hub.billing.money import MICROS_PER_UNIT, format_micros, format_rate


@admin.register(LedgerEntry)
class LedgerEntryAdmin(admin.ModelAdmin):
    list_display = (
        "created_at",
        "account_or_platform",
        "kind",
        "amount",
        "lease",
        "reason",
        "created_by",
        "external_ref",
    )
    list_filter = ("kind", "created_at", ("account", admin.EmptyFieldListFilter))
    list_select_related = ("account", "lease", "created_by")
    search_fields = (
        "account__username",
        "account__email",
        "reason",
        "external_ref",
        "lease__id",
        "created_by__username",
    )
    date_hierarchy = "created_at"
    readonly_fields = [field.name for field in LedgerEntry._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False  # the ledger is append-only: a mistake is corrected by another row

    @admin.display(description="account", ordering="account__username")
    def account_or_platform(self, entry: LedgerEntry) -> str:
        return str(entry.account) if entry.account_id is not None else "(platform)"

    @admin.display(description="amount", ordering="amount_micros")
    def amount(self, entry: LedgerEntry) -> str:
        return format_rate(entry.amount_micros)


@admin.action(description="Adjust balance (top up or correct)", permissions=["adjust_balance"])
def adjust_balance(
    modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[User]
) -> TemplateResponse | None:
    """An intermediate page asks for the amount and the reason; its submit comes back here
    with "apply" set, and each selected user gets one ledger row."""
    form = AdjustBalanceForm(request.POST if "apply" in request.POST else None)
    if form.is_bound and form.is_valid():
        users = list(queryset.order_by("pk"))
        for user in users:
            services.adjust(user, form.amount_micros, form.cleaned_data["reason"], request.user)
        modeladmin.message_user(
            request,
            f"Adjusted the balance of {len(users)} user(s) by {format_rate(form.amount_micros)}.",
            messages.SUCCESS,
        )
        return None
    users = services.with_balances(queryset.order_by("username"))
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Adjust balance",
        "opts": modeladmin.model._meta,
        "form": form,
        "users": [(user, format_micros(user.balance_micros, cents=True)) for user in users],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
    }
    return TemplateResponse(request, "admin/billing/adjust_balance.html", context)


class BalanceAdminMixin:
    """For the user admin: a balance column, the adjust action for many users, and an
    "Adjust balance" page of each user's own (their top-up requests, the form, the answer)."""

    actions = (adjust_balance,)
    change_form_template = "admin/billing/user_change_form.html"

    def get_urls(self) -> list[Any]:
        own = [
            path(
                "<int:user_id>/adjust-balance/",
                self.admin_site.admin_view(self.adjust_balance_view),  # type: ignore[attr-defined]
                name="accounts_user_adjust_balance",
            )
        ]
        return own + super().get_urls()  # type: ignore[misc]

    def adjust_balance_view(self, request: HttpRequest, user_id: int) -> HttpResponse:
        if not self.has_adjust_balance_permission(request):
            raise PermissionDenied
        person = get_object_or_404(User, pk=user_id)
        waiting = topups.waiting_requests(person)
        answering = next((r for r in waiting if str(r.pk) == request.POST.get("answers")), None)
        if request.method == "POST" and "decline" in request.POST and answering is not None:
            topups.decline_top_up(answering.pk, request.user)  # type: ignore[arg-type]
            self.message_user(request, "Request declined.", messages.INFO)  # type: ignore[attr-defined]
            return redirect("admin:accounts_user_adjust_balance", user_id=person.pk)
        first = waiting[0] if waiting else None
        form = AdjustBalanceForm(
            request.POST if request.method == "POST" else None,
            initial={
                "amount": (Decimal(first.amount_micros) / MICROS_PER_UNIT).quantize(Decimal("0.01"))
            }
            if first
            else None,
        )
        if form.is_bound and form.is_valid():
            try:
                topups.add_top_up(
                    person,
                    form.amount_micros,
                    form.cleaned_data["reason"],
                    request.user,  # type: ignore[arg-type]
                    answers=answering.pk if answering is not None else None,
                )
            except services.BillingError as exc:
                form.add_error(None, str(exc))
            else:
                self.message_user(  # type: ignore[attr-defined]
                    request,
                    f"Adjusted the balance of {person.username} by "
                    f"{format_rate(form.amount_micros)}.",
                    messages.SUCCESS,
                )
                return redirect("admin:accounts_user_change", person.pk)
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": f"Adjust the balance of {person.username}",
            "opts": User._meta,
            "person": person,
            "balance": format_micros(services.balance_micros(person), cents=True),
            "form": form,
            "waiting": waiting,
            "answering": answering or first,
            "recent": LedgerEntry.objects.filter(account=person)[:10],
        }
        return TemplateResponse(request, "admin/billing/adjust_user_balance.html", context)

    def get_queryset(self, request: HttpRequest) -> QuerySet[User]:
        return services.with_balances(super().get_queryset(request))  # type: ignore[misc]

    @admin.display(description="balance", ordering="balance_micros")
    def balance(self, user: User) -> str:
        return format_micros(user.balance_micros, cents=True)  # type: ignore[attr-defined]

    def has_adjust_balance_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("billing.add_ledgerentry")


@admin.register(User)
class HubUserAdmin(BalanceAdminMixin, UserAdmin):
    list_display = (*UserAdmin.list_display, "balance")


class _MoneyRequestAdmin(admin.ModelAdmin):
    """A queue of people's money requests (top-ups, payouts): read-only lists, each answered
    through its own page, never edited in place."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object | None = None) -> bool:
        return False

    @admin.display(description="amount", ordering="amount_micros")
    def amount(self, request_row: TopUpRequest | Payout) -> str:
        return format_micros(request_row.amount_micros, cents=True)


@admin.register(TopUpRequest)
class TopUpRequestAdmin(_MoneyRequestAdmin):
    """The queue of renters' requests; each is answered from the person's own page."""

    list_display = ("created_at", "account", "amount", "note", "state", "answer")
    list_filter = ("state",)
    list_select_related = ("account",)
    search_fields = ("account__username", "note")
    readonly_fields = [field.name for field in TopUpRequest._meta.fields]

    @admin.display(description="")
    def answer(self, entry: TopUpRequest) -> str:
        if entry.state != TopUpRequest.State.WAITING:
            return ""
        url = reverse("admin:accounts_user_adjust_balance", args=[entry.account_id])
        return format_html('<a href="{}">Add or decline…</a>', url)


@admin.register(Payout)
class PayoutAdmin(_MoneyRequestAdmin):
    """Suppliers' payout requests: send the money, then mark each paid with the reference."""

    list_display = ("requested_at", "account", "amount", "state", "reference", "paid_at", "pay")
    list_filter = ("state",)
    list_select_related = ("account",)
    search_fields = ("account__username", "reference")
    readonly_fields = [field.name for field in Payout._meta.fields]

    @admin.display(description="")
    def pay(self, payout: Payout) -> str:
        if payout.state != Payout.State.REQUESTED:
            return ""
        url = reverse("admin:billing_payout_mark_paid", args=[payout.pk])
        return format_html('<a href="{}">Mark paid…</a>', url)

    def get_urls(self) -> list[Any]:
        own = [
            path(
                "<int:payout_id>/mark-paid/",
                self.admin_site.admin_view(self.mark_paid_view),
                name="billing_payout_mark_paid",
            )
        ]
        return own + super().get_urls()

    def mark_paid_view(self, request: HttpRequest, payout_id: int) -> HttpResponse:
        if not request.user.has_perm("billing.add_ledgerentry"):
            raise PermissionDenied
        payout = get_object_or_404(Payout.objects.select_related("account"), pk=payout_id)
        form = MarkPaidForm(request.POST or None)
        if request.method == "POST" and "cancel_payout" in request.POST:
            payouts.cancel_payout(payout.pk, request.user)  # type: ignore[arg-type]
            self.message_user(request, f"Payout {payout.pk} cancelled.", messages.INFO)
            return redirect("admin:billing_payout_changelist")
        if form.is_bound and form.is_valid():
            try:
                payouts.mark_payout_paid(
                    payout.pk,
                    form.cleaned_data["reference"],
                    request.user,  # type: ignore[arg-type]
                )
            except services.BillingError as exc:
                form.add_error(None, str(exc))
            else:
                self.message_user(
                    request,
                    f"Payout {payout.pk} of {format_micros(payout.amount_micros, cents=True)} "
                    f"to {payout.account.username} marked paid.",
                    messages.SUCCESS,
                )
                return redirect("admin:billing_payout_changelist")
        context = {
            **self.admin_site.each_context(request),
            "title": f"Mark payout {payout.pk} paid",
            "opts": Payout._meta,
            "payout": payout,
            "amount": format_micros(payout.amount_micros, cents=True),
            "balance": format_micros(services.balance_micros(payout.account), cents=True),
            "form": form,
        }
        return TemplateResponse(request, "admin/billing/mark_payout_paid.html", context)
