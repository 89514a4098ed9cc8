from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from hub.health.checks import check_postgres, check_redis


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
