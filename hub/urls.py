from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path

from hub.health.metrics_view import metrics_view
from hub.health.views import healthz
from hub.installer import views as installer
from hub.web.views.accounts import admin_login
from hub.web.views.home import home

urlpatterns = [
    path("", home, name="home"),
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/fleet/", include("hub.fleet.urls")),
    path("admin/login/", admin_login, name="admin-login"),
    path("admin/", admin.site.urls),
    path("api/", include("hub.api.urls")),
    path("install.sh", installer.install_script, name="install-script"),
    path("agent/release.json", installer.release, name="agent-release"),
    path("agent/enroll", installer.enroll, name="agent-enroll"),
    re_path(r"^agent/(?P<filename>[^/]+\.whl)$", installer.wheel_file, name="agent-wheel"),
    path("internal/tunnels/", include("hub.tunnels.urls")),
    path("", include("hub.web.urls")),
]

# Used with DEBUG off: a database outage answers 503 (JSON under /api/), never a bare 500 page.
handler500 = "hub.health.views.server_error"
# Under /api/ every error is JSON in the API's shape ({"detail": ...}), also for a malformed id.
handler404 = "hub.health.views.not_found"
handler400 = "hub.health.views.bad_request"
handler403 = "hub.health.views.forbidden"
