"""Admin for money: the ledger is read-only (rows are written only by services), and balances
are changed with the "Adjust balance" action on users, which records a reason and the admin."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth.admin import UserAdmin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from hub.accounts.models import User
from hub.billing import services
from hub.billing.forms import AdjustBalanceForm
from hub.billing.models import LedgerEntry
from hub.billing.money import format_micros, format_rate


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
    """For the user admin: a balance column and the adjust action."""

    actions = (adjust_balance,)

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
