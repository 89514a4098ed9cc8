"""Sign up, log in (rate-limited), log out: Django's auth views with our forms."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.views import LoginView
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from hub.web.forms import RateLimitedLoginForm, SignUpForm


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
    form = SignUpForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, f"Welcome, {user.username}. Your account is ready.")
        return redirect("web:offers")
    return render(request, "web/signup.html", {"form": form}, status=400 if form.errors else 200)
