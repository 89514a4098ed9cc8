from __future__ import annotations

from django.urls import path

from hub.fleet import views

app_name = "fleet"

urlpatterns = [
    path("", views.fleet, name="fleet"),
    path("rollouts/", views.rollout_create, name="rollout-create"),
    path(
        "rollouts/<uuid:rollout_id>/<str:action>/",
        views.rollout_action,
        name="rollout-action",
    ),
]
