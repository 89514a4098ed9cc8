"""What a supplier host fetches to join: ``/install.sh``, the release manifest, the wheel, and
the agent token it gets for the install one-liner's enrollment code.

No login: the script and the wheel are public; the supplier's token travels only from the hub
(or the supplier's terminal) into the agent's 0600 config file.
"""

from __future__ import annotations

import json
import logging
import re
import shlex

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
)
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST, require_safe

from hub.installer import enrollment, releases

logger = logging.getLogger(__name__)

# An exchange is {"code": "cgpe_...", "host": "<hostname>"}: a few hundred bytes at most.
ENROLL_MAX_BODY_BYTES = 4096

# The URL is written into a shell script: nothing that could end a quote or a comment line.
_SAFE_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-_:\[\]]+(/[A-Za-z0-9.\-_~/]*)?$")


def _hub_url() -> str:
    url = settings.HUB_PUBLIC_URL
    if not _SAFE_URL_RE.match(url):
        raise ImproperlyConfigured(f"HUB_PUBLIC_URL {url!r} cannot be written into install.sh")
    return url


def _current_release() -> releases.Release | None:
    try:
        return releases.current()
    except releases.ReleaseError:
        logger.exception("no agent release to serve")
        return None


def _unavailable() -> HttpResponse:
    return HttpResponse(
        "the agent package is not available right now; try again later\n",
        status=503,
        content_type="text/plain; charset=utf-8",
    )


@require_safe
@never_cache
def install_script(request: HttpRequest) -> HttpResponse:
    url = _hub_url()
    text = render_to_string(
        "installer/install.sh",
        {"hub_url": mark_safe(url), "hub_url_shell": mark_safe(shlex.quote(url))},  # noqa: S308
    )
    return HttpResponse(text, content_type="text/x-shellscript; charset=utf-8")


@require_safe
@never_cache
def release(request: HttpRequest) -> HttpResponse:
    current = _current_release()
    if current is None:
        return _unavailable()
    filename = current.description["filename"]
    return JsonResponse({**current.description, "url": f"{_hub_url()}/agent/{filename}"})


@require_safe
def wheel_file(request: HttpRequest, filename: str) -> HttpResponse:
    current = _current_release()
    if current is None:
        return _unavailable()
    if filename != current.description["filename"]:
        raise Http404("no such agent release")
    return FileResponse(
        current.wheel.open("rb"),
        as_attachment=True,
        filename=filename,
        content_type="application/octet-stream",
    )


def _enroll_error(reason: str, status: int, detail: str) -> JsonResponse:
    return JsonResponse({"error": reason, "detail": detail}, status=status)


# No CSRF: nothing here rests on a cookie or a session; the code in the body is the credential.
@csrf_exempt
@require_POST
@never_cache
def enroll(request: HttpRequest) -> HttpResponse:
    """Exchange an enrollment code (JSON body) for a new agent token, once (hub/installer/
    enrollment.py). never_cache: the token must not rest in any cache (Cache-Control no-store)."""
    if "code" in request.GET:
        # The query string reaches access logs and proxies; the code belongs in the body.
        return _enroll_error(
            "code_in_url", 400, "send the enrollment code in the JSON body, never in the URL"
        )
    try:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length > ENROLL_MAX_BODY_BYTES or len(request.body) > ENROLL_MAX_BODY_BYTES:
        return _enroll_error("too_large", 413, "the request body is too large")
    try:
        body = json.loads(request.body)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested thousands deep
        body = None
    code = body.get("code") if isinstance(body, dict) else None
    host = body.get("host") if isinstance(body, dict) else None
    if not isinstance(code, str) or not isinstance(host, str | None):
        return _enroll_error(
            "bad_request", 400, 'send {"code": "cgpe_...", "host": "<hostname>"} as JSON'
        )
    try:
        token, plaintext = enrollment.exchange_enrollment_code(
            code, address=request.META.get("REMOTE_ADDR"), host=host or ""
        )
    except enrollment.EnrollmentRefused as exc:
        refusal = exc.refusal
        response = _enroll_error(refusal.reason, refusal.status, refusal.message)
        if refusal is enrollment.RATE_LIMITED:
            response["Retry-After"] = str(settings.ENROLLMENT_RATE_WINDOW_S)
        return response
    return JsonResponse({"token": plaintext, "name": token.name}, status=201)
