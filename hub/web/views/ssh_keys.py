"""A person's SSH public keys: add, list, delete. Scoped to the signed-in user."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from hub.accounts.models import SshKey
from hub.accounts.ssh_keys import MAX_PER_ACCOUNT, SshKeyError, add_ssh_key, delete_ssh_key
from hub.tunnels import renter_ssh
from hub.web.forms import SshKeyForm


@login_required
@require_http_methods(["GET", "POST"])
def ssh_keys(request: HttpRequest) -> HttpResponse:
    form = SshKeyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            key = add_ssh_key(request.user, form.cleaned_data["key"])
        except SshKeyError as exc:
            form.add_error("key", str(exc))
        else:
            messages.success(request, f"SSH key {key.fingerprint} added.")
            return redirect("web:ssh-keys")
    context = {
        "form": form,
        "keys": SshKey.objects.filter(user=request.user),
        "max_keys": MAX_PER_ACCOUNT,
        "gateway_on": renter_ssh.enabled(),
    }
    return render(request, "web/ssh_keys.html", context, status=400 if form.errors else 200)


@login_required
@require_POST
def ssh_key_delete(request: HttpRequest, key_id: int) -> HttpResponse:
    if not delete_ssh_key(request.user, key_id):
        raise Http404
    messages.success(request, "SSH key deleted; it opens nothing from now on.")
    return redirect("web:ssh-keys")
