from __future__ import annotations

from django.contrib.auth.views import LogoutView
from django.urls import path

from hub.web import terminal
from hub.web.views import (
    accounts,
    api_tokens,
    benchmarks,
    notifications,
    renter,
    ssh_keys,
    supplier,
    volumes,
)

app_name = "web"

urlpatterns = [
    path("signup/", accounts.signup, name="signup"),
    path("login/", accounts.RateLimitedLoginView.as_view(), name="login"),
    path("logout/", LogoutView.as_view(), name="logout"),
    path("offers/", renter.offers, name="offers"),
    path("rent/<int:gpu_id>/", renter.rent, name="rent"),
    path("leases/", renter.lease_list, name="leases"),
    path("leases/<uuid:lease_id>/", renter.lease_detail, name="lease"),
    path("leases/<uuid:lease_id>/panel/", renter.lease_panel, name="lease-panel"),
    path("leases/<uuid:lease_id>/stop/", renter.lease_stop, name="lease-stop"),
    path(
        "leases/<uuid:lease_id>/benchmarks/",
        benchmarks.benchmark_start,
        name="lease-benchmark-start",
    ),
    path(
        "leases/<uuid:lease_id>/benchmarks/panel/",
        benchmarks.benchmark_panel,
        name="lease-benchmarks",
    ),
    path("leases/<uuid:lease_id>/terminal/", terminal.terminal_page, name="lease-terminal"),
    path(
        "leases/<uuid:lease_id>/access-token/",
        renter.lease_access_token,
        name="lease-access-token",
    ),
    path("usage/", renter.usage, name="usage"),
    path("usage/top-up/", renter.top_up_request, name="top-up-request"),
    path("volumes/", volumes.volume_list, name="volumes"),
    path("volumes/<uuid:volume_id>/delete/", volumes.volume_delete, name="volume-delete"),
    path("volumes/<uuid:volume_id>/resize/", volumes.volume_resize, name="volume-resize"),
    path("account/api-tokens/", api_tokens.api_tokens, name="api-tokens"),
    path(
        "account/api-tokens/<int:token_id>/revoke/",
        api_tokens.api_token_revoke,
        name="api-token-revoke",
    ),
    path("account/ssh-keys/", ssh_keys.ssh_keys, name="ssh-keys"),
    path("account/ssh-keys/<int:key_id>/delete/", ssh_keys.ssh_key_delete, name="ssh-key-delete"),
    path("account/notifications/", notifications.notifications, name="notifications"),
    path(
        "account/notifications/low-balance/",
        notifications.low_balance,
        name="notifications-low-balance",
    ),
    path(
        "account/notifications/email/",
        notifications.email_preferences,
        name="notifications-email",
    ),
    path("account/notifications/webhooks/", notifications.endpoint_add, name="webhook-add"),
    path(
        "account/notifications/webhooks/<int:endpoint_id>/",
        notifications.endpoint_update,
        name="webhook-update",
    ),
    path(
        "account/notifications/webhooks/<int:endpoint_id>/delete/",
        notifications.endpoint_delete,
        name="webhook-delete",
    ),
    path(
        "account/notifications/webhooks/<int:endpoint_id>/rotate-secret/",
        notifications.endpoint_rotate,
        name="webhook-rotate",
    ),
    path(
        "account/notifications/webhooks/<int:endpoint_id>/test/",
        notifications.endpoint_test,
        name="webhook-test",
    ),
    path("notifications/unsubscribe/<str:token>/", notifications.unsubscribe, name="unsubscribe"),
    path("supplier/hosts/", supplier.hosts, name="hosts"),
    path("supplier/hosts/panel/", supplier.hosts_panel, name="hosts-panel"),
    path("supplier/hosts/<int:host_id>/status/", supplier.host_status, name="host-status"),
    path("supplier/hosts/<int:host_id>/details/", supplier.host_details, name="host-details"),
    path(
        "supplier/hosts/<int:host_id>/maintenance/",
        supplier.host_maintenance,
        name="host-maintenance",
    ),
    path(
        "supplier/hosts/<int:host_id>/default-price/",
        supplier.host_default_price,
        name="host-default-price",
    ),
    path("supplier/gpus/<int:gpu_id>/", supplier.gpu_terms, name="gpu-terms"),
    path("supplier/tokens/", supplier.tokens, name="tokens"),
    path("supplier/tokens/<int:token_id>/revoke/", supplier.token_revoke, name="token-revoke"),
    path(
        "supplier/install-commands/",
        supplier.install_command_create,
        name="install-command-create",
    ),
    path(
        "supplier/install-commands/<int:code_id>/cancel/",
        supplier.install_command_cancel,
        name="install-command-cancel",
    ),
    path("supplier/earnings/", supplier.earnings, name="earnings"),
    path("supplier/payouts/", supplier.payout_request, name="payout-request"),
    path("supplier/payouts/<int:payout_id>/cancel/", supplier.payout_cancel, name="payout-cancel"),
]
