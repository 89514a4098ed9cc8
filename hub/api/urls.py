from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularSwaggerView

from hub.api import exec_views, views
from hub.api.schema_view import CachedSchemaView

app_name = "api"

v1 = [
    path("offers/", views.OfferList.as_view(), name="offers"),
    path("templates/", views.TemplateList.as_view(), name="templates"),
    path("templates/<slug:slug>/", views.TemplateDetail.as_view(), name="template"),
    path("leases/", views.LeaseList.as_view(), name="leases"),
    path("leases/<uuid:pk>/", views.LeaseDetail.as_view(), name="lease"),
    path("leases/<uuid:pk>/stop/", views.LeaseStop.as_view(), name="lease-stop"),
    path("leases/<uuid:pk>/logs/", views.LeaseLogs.as_view(), name="lease-logs"),
    path("leases/<uuid:pk>/benchmarks/", views.LeaseBenchmarks.as_view(), name="lease-benchmarks"),
    path("leases/<uuid:pk>/exec/", exec_views.lease_exec, name="lease-exec"),
    path(
        "leases/<uuid:pk>/access-token/",
        views.LeaseAccessToken.as_view(),
        name="lease-access-token",
    ),
    path("volumes/", views.VolumeList.as_view(), name="volumes"),
    path("volumes/<uuid:pk>/", views.VolumeDetail.as_view(), name="volume"),
    path("gpus/", views.GpuList.as_view(), name="gpus"),
    path("gpus/<int:pk>/", views.GpuDetail.as_view(), name="gpu"),
    path("account/", views.Account.as_view(), name="account"),
    path("top-ups/", views.TopUpList.as_view(), name="top-ups"),
    path("payouts/", views.PayoutList.as_view(), name="payouts"),
    path("payouts/<int:pk>/cancel/", views.PayoutCancel.as_view(), name="payout-cancel"),
    path("tokens/", views.ApiTokenList.as_view(), name="tokens"),
    path("tokens/<int:pk>/", views.ApiTokenDetail.as_view(), name="token"),
    path("ssh-keys/", views.SshKeyList.as_view(), name="ssh-keys"),
    path("ssh-keys/<int:pk>/", views.SshKeyDetail.as_view(), name="ssh-key"),
]

urlpatterns = [
    path("v1/", include(v1)),
    # The schema and its docs page are public: they describe, they hold no data.
    path(
        "schema/",
        CachedSchemaView.as_view(authentication_classes=[], permission_classes=[]),
        name="schema",
    ),
    path(
        "docs/",
        SpectacularSwaggerView.as_view(
            url_name="api:schema", authentication_classes=[], permission_classes=[]
        ),
        name="docs",
    ),
]
