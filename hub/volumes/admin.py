from django.contrib import admin

from hub.volumes.models import Volume


@admin.register(Volume)
class VolumeAdmin(admin.ModelAdmin):
    """Read-only: volumes change through their owner and the agents' reports."""

    list_display = ["label", "kind", "renter", "host", "state", "used_bytes", "size_cap_bytes"]
    list_filter = ["kind", "state", "removed_reason"]
    search_fields = ["label", "renter__username", "host__hostname", "wire_name"]

    def has_add_permission(self, request: object) -> bool:
        return False

    def has_change_permission(self, request: object, obj: object = None) -> bool:
        return False
