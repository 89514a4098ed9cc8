"""The hub's answers to the tunnel gateway (under /internal/tunnels/, gated by the shared
gateway secret) and the pages a tunnel URL shows when it cannot reach the container."""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods

from hub.tunnels import access, renter_ssh, services
from hub.tunnels.gateway_config import EDGE_ERROR_HEADER, EDGE_TIMEOUT_HEADER
from hub.tunnels.services import Route

SECRET_HEADER = "X-CloudGPU-Gateway-Secret"  # noqa: S105 - a header name
HOST_HEADER = "X-CloudGPU-Tunnel-Host"
PORT_HEADER = "X-CloudGPU-Tunnel-Port"


def _from_gateway(request: HttpRequest) -> None:
    """Only the gateway knows the secret; without one configured the endpoints do not exist."""
    expected = settings.TUNNEL_GATEWAY_SECRET
    given = request.headers.get(SECRET_HEADER, "")
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Http404


def _route(request: HttpRequest) -> Route:
    tokens = access.candidates(dict(request.headers), request.COOKIES)
    return services.route(request.headers.get(HOST_HEADER, ""), tokens)


@never_cache
@require_GET
def authorized_keys(request: HttpRequest) -> HttpResponse:
    _from_gateway(request)
    user, key_type, key = (request.GET.get(name, "") for name in ("user", "type", "key"))
    # Two login users, two rules: the agents' per-lease keys may listen (-R), renters' account
    # keys may connect (-L/-W), each only to their own leases' ports.
    if user and user == settings.TUNNEL_GATEWAY_RENTER_USER:
        text = renter_ssh.authorized_keys(key_type, key)
    else:
        text = services.authorized_keys(user, key_type, key)
    return HttpResponse(text, content_type="text/plain; charset=utf-8")


@never_cache
@require_GET
def edge_auth(request: HttpRequest) -> HttpResponse:
    """nginx's auth_request: 204 with the port to proxy to, or 403 and the edge asks for the
    page (auth_request passes only 401 and 403 on; the page holds the real status)."""
    _from_gateway(request)
    found = _route(request)
    if found.listen_port is None:
        return HttpResponse(status=403)
    response = HttpResponse(status=204)
    response[PORT_HEADER] = str(found.listen_port)
    return response


@never_cache
@csrf_exempt  # the edge fetches it for any method the client used; it changes nothing
def edge_page(request: HttpRequest) -> HttpResponse:
    _from_gateway(request)
    found = _route(request)
    context: dict[str, Any] = {"route": found, "host": request.headers.get(HOST_HEADER, "")}
    if found.status == 404:
        return render(request, "tunnels/not_found.html", context, status=404)
    if found.status == 401:
        return render(request, "tunnels/access.html", context, status=401)
    context["tunnel_state"] = found.tunnel.get_state_display() if found.tunnel else ""
    if found.listen_port is not None and request.headers.get(EDGE_ERROR_HEADER) == "quiet":
        # The service took the request and then sent nothing for longer than the edge's limit.
        context["limit_s"] = request.headers.get(EDGE_TIMEOUT_HEADER, "")
        return render(request, "tunnels/quiet.html", context, status=504)
    # Routable, yet the edge could not get through (the container's port does not answer), or
    # not routable because the lease or its tunnel is not up: 502 naming the state either way.
    return render(request, "tunnels/unavailable.html", context, status=502)


@never_cache
@csrf_exempt  # a token in the body is the credential itself; Origin is checked instead
@require_http_methods(["GET", "POST"])
def access_form(request: HttpRequest) -> HttpResponse:
    """``/__cloudgpu/access`` on the tunnel's own host: trade the lease's token for a cookie,
    so a browser can open a protected URL without the token ever being in a URL."""
    _from_gateway(request)
    host = request.headers.get(HOST_HEADER, "")
    found = _route(request)
    if found.tunnel is None:
        return render(request, "tunnels/not_found.html", {"host": host}, status=404)
    context: dict[str, Any] = {"route": found, "host": host}
    if request.method == "GET":
        return render(request, "tunnels/access.html", context, status=200)
    origin = request.headers.get("Origin")
    if origin and origin.split("://", 1)[-1].lower() != host.lower():
        return HttpResponse("cross-site form post refused", status=403, content_type="text/plain")
    token = request.POST.get("token", "").strip()
    if not access.grants(found.tunnel.lease_id, token):
        context["error"] = "That token does not open this service."
        return render(request, "tunnels/access.html", context, status=401)
    response = HttpResponseRedirect("/")
    response.set_cookie(
        access.COOKIE,
        token,
        max_age=settings.TUNNEL_ACCESS_TOKEN_MAX_AGE_S,
        httponly=True,
        secure=settings.TUNNEL_URL_SCHEME == "https",
        samesite="Lax",
    )
    return response
