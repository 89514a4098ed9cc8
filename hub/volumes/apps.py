from django.apps import AppConfig


class VolumesConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "hub.volumes"
