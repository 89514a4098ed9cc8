"""Renters' volumes page: create, see usage and why a volume went, delete."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from hub.suppliers.models import Host
from hub.volumes import services
from hub.volumes.models import Volume
from hub.web.forms import VolumeForm


def _hosts_for(request: HttpRequest) -> QuerySet[Host]:
    """Where a renter may keep a volume: hosts with GPUs for rent now, or theirs already."""
    rentable = Q(
        status=Host.Status.ONLINE, gpus__listed=True, gpus__priced=True, gpus__present=True
    )
    return (
        Host.objects.filter(rentable | Q(volumes__renter=request.user))
        .distinct()
        .order_by("hostname", "pk")
    )


@login_required
@require_http_methods(["GET", "POST"])
def volume_list(request: HttpRequest) -> HttpResponse:
    form = VolumeForm(request.POST or None, hosts=_hosts_for(request))
    status = 200
    if request.method == "POST":
        if form.is_valid():
            try:
                volume = services.create_volume(
                    request.user,
                    form.cleaned_data["host"],
                    form.cleaned_data["name"],
                    form.cleaned_data["size_gib"],
                )
            except services.VolumeError as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(
                    request,
                    f"Volume {volume.label} created on {volume.host.label}: mount it when"
                    " you rent a GPU of that host.",
                )
                return redirect("web:volumes")
        status = 400
    context: dict[str, Any] = {
        "form": form,
        "volumes": Volume.objects.filter(renter=request.user).select_related("host")[:300],
    }
    return render(request, "web/volumes.html", context, status=status)


@login_required
@require_POST
def volume_delete(request: HttpRequest, volume_id: Any) -> HttpResponse:
    volume = get_object_or_404(Volume, pk=volume_id, renter=request.user)
    try:
        services.delete_volume(request.user, volume.pk)
    except services.VolumeError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Volume {volume.label} is being deleted with its files.")
    return redirect("web:volumes")


@login_required
@require_POST
def volume_resize(request: HttpRequest, volume_id: Any) -> HttpResponse:
    volume = get_object_or_404(Volume, pk=volume_id, renter=request.user)
    try:
        size = int(request.POST.get("size_gib", ""))
        services.resize_volume(request.user, volume.pk, size)
    except ValueError:
        messages.error(request, "Give the new size as a whole number of GiB.")
    except services.VolumeError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Volume {volume.label} now holds up to {size} GiB.")
    return redirect("web:volumes")
