from __future__ import annotations

from django.urls import path

from hub.fleet import views

app_name = "fleet"

urlpatterns = [path("", views.fleet, name="fleet")]
