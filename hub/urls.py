from __future__ import annotations

from django.contrib import admin
from django.urls import path
from django.views.generic import TemplateView

from hub.health.views import healthz

urlpatterns = [
    path("", TemplateView.as_view(template_name="home.html"), name="home"),
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
]
