"""Sign up, log in (rate-limited), log out: Django's auth views with our forms."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import login
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from hub.web import ratelimit
from hub.web.forms import RateLimitedAdminLoginForm, RateLimitedLoginForm, SignUpForm


class RateLimitedLoginView(LoginView):
    template_name = "web/login.html"
    authentication_form = RateLimitedLoginForm
    redirect_authenticated_user = True

    def form_invalid(self, form: RateLimitedLoginForm) -> HttpResponse:
        response = super().form_invalid(form)
        if form.has_error("__all__", "rate_limited"):
            response.status_code = 429
        return response


@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    if request.user.is_authenticated:
        return redirect("web:offers")
    if request.method == "POST" and not ratelimit.signup_allowed(ratelimit.client_address(request)):
        form = SignUpForm(request.POST)
        form.full_clean()
        form.add_error(None, "Too many sign-ups from your address. Try again in an hour.")
        return render(request, "web/signup.html", {"form": form}, status=429)
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome, {user.username}. Your account is ready.")
        return redirect("web:offers")
    return render(request, "web/signup.html", {"form": form}, status=400 if form.errors else 200)


# Once, at import (hub/urls.py imports this module): the admin's own login form is the limited one.
admin.site.login_form = RateLimitedAdminLoginForm


def admin_login(request: HttpRequest) -> HttpResponse:
    """The admin's login under the dashboard's limiter (one limiter for every login form),
    answering 429 like /login/ while a username is locked out."""
    response = admin.site.login(request)
    form = (getattr(response, "context_data", None) or {}).get("form")
    if form is not None and form.has_error("__all__", "rate_limited"):
        response.status_code = 429
    return response
