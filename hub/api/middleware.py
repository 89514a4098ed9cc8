"""Bounds on API requests that must hold before the body is read."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class ApiBodyLimitMiddleware:
    """413 in the API's error shape for a body over ``API_MAX_BODY_BYTES`` under /api/.

    Judged from Content-Length, so a 10 MB upload costs nothing to refuse; a body without one
    (chunked) is cut off by Django's own DATA_UPLOAD_MAX_MEMORY_SIZE check when it is read.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith("/api/"):
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                return JsonResponse({"detail": "Content-Length is not a number."}, status=400)
            if length > settings.API_MAX_BODY_BYTES:
                limit = settings.API_MAX_BODY_BYTES
                return JsonResponse(
                    {"detail": f"The request body is over the API's limit of {limit} bytes."},
                    status=413,
                )
        return self.get_response(request)
