"""A renter's REST API tokens: create (shown once), list, revoke. Scoped to the signed-in user."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from hub.accounts.api_tokens import create_api_token, revoke_api_token
from hub.accounts.models import ApiToken
from hub.web.forms import TokenForm

_NEW_TOKEN_KEY = "web:new-api-token"  # noqa: S105 (a session key)


@login_required
@require_http_methods(["GET", "POST"])
def api_tokens(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        _, plaintext = create_api_token(request.user, form.cleaned_data["name"])
        # Kept only until the next page view, which shows it once.
        request.session[_NEW_TOKEN_KEY] = plaintext
        return redirect("web:api-tokens")
    context = {
        "form": form,
        "tokens": ApiToken.objects.filter(user=request.user).order_by("-created_at"),
        "new_token": request.session.pop(_NEW_TOKEN_KEY, None),
        "api_base": request.build_absolute_uri("/api/v1/"),
    }
    return render(request, "web/api_tokens.html", context)


@login_required
@require_POST
def api_token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    if not ApiToken.objects.filter(pk=token_id, user=request.user).exists():
        raise Http404
    if revoke_api_token(request.user, token_id):
        messages.success(request, "API token revoked; requests with it are refused from now on.")
    return redirect("web:api-tokens")
