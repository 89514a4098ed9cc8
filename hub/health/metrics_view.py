"""``/metrics``: the hub's Prometheus metrics, for a scraper the hub's settings let in.

Everything the hub's processes counted (hub/lib/metrics.py, added up across processes when
PROMETHEUS_MULTIPROC_DIR is set) plus the fleet's gauges counted from Postgres now
(hub/fleet/metrics.py). Who may read it: a client address in METRICS_ALLOW_IPS (loopback by
default), or anyone sending ``Authorization: Bearer <METRICS_TOKEN>`` when a token is set.
Nothing here names a host, lease or user, but fleet sizes and traffic are still the operator's
business, hence not public.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from hub.fleet.metrics import FleetCollector
from hub.lib import metrics, metrics_dir

log = logging.getLogger(__name__)


def allowed(request: HttpRequest) -> bool:
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            credential.strip().encode(), token.encode()
        ):
            return True
    try:
        client = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(client in network for network in settings.METRICS_ALLOW_NETWORKS)


def _registry() -> CollectorRegistry:
    if metrics_dir.multiproc_dir() is None:
        return REGISTRY  # one process: its own values
    # Every process sharing the folder, live or dead, in any container (hub/lib/metrics_dir.py).
    registry: CollectorRegistry = metrics_dir.registry()
    return registry


@require_GET
@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not allowed(request):
        response = HttpResponse("not allowed to read the metrics\n", status=403)
        if settings.METRICS_TOKEN:
            response.status_code = 401
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    output = generate_latest(_registry())
    try:
        fleet = CollectorRegistry(auto_describe=False)
        fleet.register(FleetCollector())
        output += generate_latest(fleet)
    except Exception:
        # Postgres away: the process metrics still tell the scraper the hub is up and why.
        metrics.STORE_ERRORS.labels("postgres").inc()
        log.exception("fleet gauges unavailable for /metrics")
    return HttpResponse(output, content_type=CONTENT_TYPE_LATEST)
