"""The Content-Security-Policy every hub response carries.

Scripts only from the hub's own static files: no inline script, no eval, no other origin, so
an injected ``<script>`` or ``onerror=`` attribute does not run even if an escaping bug let it
into a page. The dashboard (htmx and live.js) and Django's admin need nothing more; a test
(tests/hub/web/test_csp.py) keeps inline scripts and ``on*`` handlers out of every template.
Styles may still be inline (``style=`` attributes, htmx's indicator style): a style cannot
run code. Django 5.2 has no CSP support of its own (6.0 adds it), hence this middleware.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:  # settings import this module for DEFAULT_POLICY: keep its imports light
    from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"

DEFAULT_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        # 'self' includes ws(s):// to this origin: the live socket (hub/web/static/web/live.js).
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        policy = settings.CONTENT_SECURITY_POLICY
        if policy and HEADER not in response:
            response[HEADER] = policy
        return response
