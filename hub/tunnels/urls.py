from __future__ import annotations

from django.urls import path

from hub.tunnels import views

urlpatterns = [
    path("authorized-keys", views.authorized_keys, name="tunnel-authorized-keys"),
    path("edge/auth", views.edge_auth, name="tunnel-edge-auth"),
    path("edge/page", views.edge_page, name="tunnel-edge-page"),
    path("edge/access", views.access_form, name="tunnel-edge-access"),
]
