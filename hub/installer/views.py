"""What a supplier host fetches to join: ``/install.sh``, the release manifest, the wheel.

No login: the script and the wheel are public; the supplier's token travels only from the
supplier's terminal into the agent's 0600 config file.
"""

from __future__ import annotations

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
from django.views.decorators.http import require_safe

from hub.installer.services import AgentWheelError, WheelInfo, build_agent_wheel

logger = logging.getLogger(__name__)

# The URL is written into a shell script: nothing that could end a quote or a comment line.
_SAFE_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-_:\[\]]+(/[A-Za-z0-9.\-_~/]*)?$")


def _hub_url() -> str:
    url = settings.HUB_PUBLIC_URL
    if not _SAFE_URL_RE.match(url):
        raise ImproperlyConfigured(f"HUB_PUBLIC_URL {url!r} cannot be written into install.sh")
    return url


def _current_wheel() -> WheelInfo | None:
    try:
        return build_agent_wheel(settings.AGENT_DIST_DIR)
    except AgentWheelError:
        logger.exception("building the agent wheel failed")
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
    wheel = _current_wheel()
    if wheel is None:
        return _unavailable()
    return JsonResponse(
        {
            "version": wheel.version,
            "filename": wheel.filename,
            "sha256": wheel.sha256,
            "url": f"{_hub_url()}/agent/{wheel.filename}",
        }
    )


@require_safe
def wheel_file(request: HttpRequest, filename: str) -> HttpResponse:
    wheel = _current_wheel()
    if wheel is None:
        return _unavailable()
    if filename != wheel.filename:
        raise Http404("no such agent release")
    return FileResponse(
        wheel.path.open("rb"),
        as_attachment=True,
        filename=wheel.filename,
        content_type="application/octet-stream",
    )
