"""A renter's REST API tokens: create (shown once), list, revoke. Scoped to the signed-in user."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from hub.accounts.api_tokens import create_api_token, revoke_api_token
from hub.accounts.models import ApiToken
from hub.web.forms import ApiTokenForm


@login_required
@never_cache
@require_http_methods(["GET", "POST"])
def api_tokens(request: HttpRequest) -> HttpResponse:
    form = ApiTokenForm(request.POST or None)
    new_token, created = None, None
    if request.method == "POST" and form.is_valid():
        # Shown in this response only: a plaintext token is never kept anywhere, not even in
        # the session store until the next page view (issue 14). never_cache: not in caches.
        created, new_token = create_api_token(
            request.user, form.cleaned_data["name"], form.cleaned_data["scopes"]
        )
        form = ApiTokenForm()
    context = {
        "form": form,
        "tokens": ApiToken.objects.filter(user=request.user).order_by("-created_at"),
        "new_token": new_token,
        "new_token_scopes": created.scopes if created else [],
        "api_base": request.build_absolute_uri("/api/v1/"),
    }
    return render(request, "web/api_tokens.html", context, status=201 if new_token else 200)


@login_required
@require_POST
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    if not ApiToken.objects.filter(pk=token_id, user=request.user).exists():
        raise Http404
    if revoke_api_token(request.user, token_id):
        messages.success(request, "API token revoked; requests with it are refused from now on.")
    return redirect("web:api-tokens")
