from __future__ import annotations

import sys

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from hub.health.checks import check_postgres, check_redis

# A connection Postgres refused, or none free in the pool within DATABASE_POOL_TIMEOUT_S: the
# request may well succeed a moment later, so it is "unavailable", not "broken".
RETRY_AFTER_S = 5
_UNAVAILABLE = "The service is briefly unavailable; please try again in a few seconds."
_BROKEN = "Something went wrong on our side; it has been logged."
# Self-contained: the site's templates run context processors that need the database.
_PAGE = (
    "<!doctype html><html lang=en><meta charset=utf-8><title>CloudGPU</title>"
    "<body style='font-family:system-ui;margin:3rem'><h1>CloudGPU</h1><p>{}</p>"
    "<p><a href='/'>Go to the dashboard</a></p></body></html>"
)


@require_GET
@never_cache
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when Postgres and Redis answer; 503 naming each one that does not."""
    problems = {
        name: problem
        for name, problem in (("postgres", check_postgres()), ("redis", check_redis()))
        if problem is not None
    }
    if problems:
        return JsonResponse(
            {"status": "unavailable", "failing": sorted(problems), "errors": problems}, status=503
        )
    return JsonResponse({"status": "ok"})


def server_error(request: HttpRequest) -> HttpResponse:
    """handler500 (DEBUG off): 503 with Retry-After when the database failed, else 500; JSON in
    the API's error shape under /api/, a page of its own elsewhere. No detail leaves the hub:
    Django has logged the traceback already."""
    exc = sys.exc_info()[1]
    # Refused, dropped, or no pooled connection free in time (OperationalError) and a closed
    # connection (InterfaceError) mean "no database right now"; IntegrityError and the like are
    # bugs and stay 500.
    unavailable = isinstance(exc, OperationalError | InterfaceError)
    status, detail = (503, _UNAVAILABLE) if unavailable else (500, _BROKEN)
    response = _api_error(request, status, detail, detail)
    if unavailable:
        response["Retry-After"] = str(RETRY_AFTER_S)
    return response


def _api_error(request: HttpRequest, status: int, detail: str, page: str) -> HttpResponse:
    """``{"detail": detail}`` under /api/ (the API's error shape), else a page saying ``page``."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": detail}, status=status)
    return HttpResponse(_PAGE.format(page), status=status)


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler404 (DEBUG off): the API's JSON shape under /api/ (a malformed id included)."""
    return _api_error(request, 404, "Not found.", "There is nothing at this address.")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler400: e.g. a host not in ALLOWED_HOSTS, a body too large for a form."""
    return _api_error(request, 400, "The request could not be understood.", "Bad request.")


def forbidden(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """handler403 (CSRF failures have their own view, below)."""
    return _api_error(request, 403, "You may not do that.", "You may not do that.")


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """CSRF_FAILURE_VIEW: a session-authenticated API call without its CSRF token gets JSON."""
    return _api_error(
        request,
        403,
        "CSRF check failed: send the csrftoken cookie's value as X-CSRFToken, or use a token.",
        "This form has expired or came from another site. Go back, reload and try again.",
    )
