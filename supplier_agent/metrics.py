"""``cloudgpu-agent run --metrics 127.0.0.1:9835``: the host's GPUs and the agent's own state
for Prometheus, off unless asked for.

The GPU series carry dcgm-exporter's names and labels (``DCGM_FI_DEV_GPU_UTIL{gpu, UUID,
modelName, Hostname}`` ...), so dashboards built for dcgm-exporter work unchanged; the values come
from NVML through the agent's own session (gpu.py), read when Prometheus scrapes, never from an
``nvidia-smi`` process. The agent's series are ``cloudgpu_agent_*``. prometheus_client's server
runs in a thread of its own: a slow scrape never holds the agent's event loop, and the NVML
calls it makes are the same thread-safe ones the heartbeat makes.

The listener binds where told; the default is loopback, since GPU telemetry tells anyone who can
read it what the host's renters are doing. With a bearer token (``CLOUDGPU_METRICS_TOKEN``, or
``CLOUDGPU_METRICS_TOKEN_FILE`` / ``--metrics-token-file``: never a command-line value, which
every user of the host can read in the process list) a scrape must send
``Authorization: Bearer <token>``, and only then may it bind an address other than loopback.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from supplier_agent.config import is_loopback
from supplier_agent.gpu import GpuQueryError, Nvml
from supplier_agent.gpu_health import HealthWatch
from supplier_agent.protocol import GpuHealth

log = logging.getLogger(__name__)

DEFAULT_PORT = 9835  # dcgm-exporter uses 9400; ours is another exporter on the same host
TEMPERATURE_GPU = 0
CLOCK_SM = 1
CLOCK_MEM = 2


TOKEN_ENV = "CLOUDGPU_METRICS_TOKEN"  # noqa: S105 (a variable's name, not a secret)
TOKEN_FILE_ENV = "CLOUDGPU_METRICS_TOKEN_FILE"  # noqa: S105
TOKEN_MIN_LENGTH = 16  # as the hub's METRICS_TOKEN


class MetricsSetupError(ValueError):
    """The metrics endpoint cannot be served as asked (a usage error: exit 2)."""


class MetricsAddressError(MetricsSetupError):
    pass


def read_token(token_file: str | None, environ: MutableMapping[str, str]) -> str | None:
    """The scrape token: the first line of ``token_file`` (``--metrics-token-file``), else of
    the file ``CLOUDGPU_METRICS_TOKEN_FILE`` names, else ``CLOUDGPU_METRICS_TOKEN``; None for
    none. The variable is taken out of ``environ`` so that nothing the agent starts (docker,
    ssh) inherits it."""
    value = environ.pop(TOKEN_ENV, "")
    path = token_file or environ.get(TOKEN_FILE_ENV) or ""
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise MetricsSetupError(f"cannot read the metrics token file {path}: {exc}") from None
        value = lines[0] if lines else ""
        if not value.strip():
            raise MetricsSetupError(f"the metrics token file {path} is empty")
    token = value.strip()
    if not token:
        return None
    if len(token) < TOKEN_MIN_LENGTH:
        raise MetricsSetupError(
            f"the metrics token is shorter than {TOKEN_MIN_LENGTH} characters; "
            "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return token


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); a bare port means loopback."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise MetricsAddressError(f"--metrics wants HOST:PORT, not {text!r}") from None
    if not 1 <= number <= 65535:
        raise MetricsAddressError(f"--metrics port must be 1-65535, not {number}")
    return host, number


@dataclass
class AgentView:
    """What the collector reads of the agent, as callables: the agent owns the values."""

    connected: Callable[[], bool]
    reconnects: Callable[[], int]
    leases: Callable[[], int]


class AgentCollector(Collector):
    def __init__(self, view: AgentView, nvml: Nvml | None, health: HealthWatch | None) -> None:
        self._view = view
        self._nvml = nvml
        self._health = health
        self._hostname = socket.gethostname()

    def collect(self) -> Iterator[Any]:
        connected = GaugeMetricFamily(
            "cloudgpu_agent_hub_connected", "1 while the agent is registered with the hub."
        )
        connected.add_metric([], 1.0 if self._view.connected() else 0.0)
        yield connected
        reconnects = CounterMetricFamily(
            "cloudgpu_agent_reconnects", "Connections to the hub lost since the agent started."
        )
        reconnects.add_metric([], self._view.reconnects())
        yield reconnects
        leases = GaugeMetricFamily("cloudgpu_agent_leases", "Leases this host holds now.")
        leases.add_metric([], self._view.leases())
        yield leases
        if self._nvml is not None and self._nvml.available:
            yield from self._gpus(self._nvml)

    def _gpus(self, nvml: Nvml) -> Iterator[Any]:
        labels = ["gpu", "UUID", "modelName", "Hostname"]

        def family(name: str, text: str, counter: bool = False) -> Any:
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            return kind(name, text, labels=labels)

        util = family("DCGM_FI_DEV_GPU_UTIL", "GPU utilisation (in %).")
        fb_used = family("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
        fb_free = family("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
        temp = family("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")
        power = family("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")
        sm_clock = family("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).")
        mem_clock = family("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).")
        # dcgm-exporter's XID field is the last XID seen; the count is ours.
        last_xid = family("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
        xids = family(
            "cloudgpu_agent_gpu_xid_errors", "XID errors since the agent started.", counter=True
        )
        ecc_sbe = family("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Single-bit volatile ECC errors.")
        ecc_dbe = family("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Double-bit volatile ECC errors.")
        thermal = family(
            "cloudgpu_agent_gpu_thermal_throttle", "1 while the GPU slows down for heat."
        )
        lost = family("cloudgpu_agent_gpu_lost", "1 when NVML has lost the GPU (off the bus).")
        health: dict[int, GpuHealth] = {}
        if self._health is not None:
            health = {g.index: g for g in self._health.sample()}
        for gpu in nvml.gpus():
            key = [str(gpu.index), gpu.uuid, gpu.name, self._hostname]
            util.add_metric(key, gpu.utilization_pct)
            fb_used.add_metric(key, gpu.memory_used_bytes // 2**20)
            fb_free.add_metric(key, max(gpu.memory_total_bytes - gpu.memory_used_bytes, 0) // 2**20)
            handle = _quiet(nvml.handle, gpu.index)
            if handle is not None:
                _add(temp, key, nvml.call, "nvmlDeviceGetTemperature", handle, TEMPERATURE_GPU)
                _add(power, key, nvml.call, "nvmlDeviceGetPowerUsage", handle, scale=1 / 1000)
                _add(sm_clock, key, nvml.call, "nvmlDeviceGetClockInfo", handle, CLOCK_SM)
                _add(mem_clock, key, nvml.call, "nvmlDeviceGetClockInfo", handle, CLOCK_MEM)
            state = health.get(gpu.index)
            if state is not None:
                last_xid.add_metric(key, state.xids[-1] if state.xids else 0)
                xids.add_metric(key, state.xid_count)
                ecc_sbe.add_metric(key, state.ecc_corrected)
                ecc_dbe.add_metric(key, state.ecc_uncorrected)
                thermal.add_metric(key, 1.0 if state.thermal_throttle else 0.0)
                lost.add_metric(key, 0.0)
        for index, state in health.items():
            if state.lost:  # gone from the listing: only its health says it existed
                lost.add_metric([str(index), state.uuid, "", self._hostname], 1.0)
        yield from (util, fb_used, fb_free, temp, power, sm_clock, mem_clock)
        yield from (last_xid, xids, ecc_sbe, ecc_dbe, thermal, lost)


def _quiet(read: Callable[..., Any], *args: Any) -> Any:
    try:
        return read(*args)
    except GpuQueryError:
        return None


def _add(
    family: Any, key: list[str], read: Callable[..., Any], *args: Any, scale: float = 1.0
) -> None:
    """One sample, or none where this GPU cannot say (NOT_SUPPORTED is common: no power sensor
    on some boards): a missing series, never a made-up zero."""
    value = _quiet(read, *args)
    if value is not None:
        family.add_metric(key, float(value) * scale)


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a stuck scraper never holds the agent's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per scrape on stderr is noise


def _authorized(app: Any, token: str) -> Any:
    """``app`` behind ``Authorization: Bearer <token>`` (compared in constant time)."""
    expected = token.encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        scheme, _, credential = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            credential.strip().encode(), expected
        ):
            return app(environ, start_response)  # type: ignore[no-any-return]
        start_response(
            "401 Unauthorized",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("WWW-Authenticate", 'Bearer realm="cloudgpu-agent"'),
            ],
        )
        return [b"a bearer token is required to read the metrics\n"]

    return guarded


def serve(address: str, collector: AgentCollector, token: str | None = None) -> Any:
    """Start the metrics listener in a thread; returns the server (``shutdown()`` stops it,
    ``server_close()`` frees the port). Without ``token`` it binds loopback only."""
    from prometheus_client import make_wsgi_app

    host, port = parse_address(address)
    if token is None and not is_loopback(host):
        raise MetricsSetupError(
            f"--metrics {host}:{port} is not a loopback address: anyone who reaches it would read "
            f"the host's GPU telemetry. Set a token ({TOKEN_FILE_ENV}, --metrics-token-file or "
            f"{TOKEN_ENV}) or bind 127.0.0.1"
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    app = make_wsgi_app(registry)
    if token is not None:
        app = _authorized(app, token)
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("_MetricsServer", (_Server,), {"address_family": family})
    server: WSGIServer = make_server(host, port, app, server_class, _QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    log.info(
        "metrics on http://%s:%d/metrics (%s)",
        host,
        port,
        "bearer token required" if token is not None else "no token: loopback only",
    )
    return server
