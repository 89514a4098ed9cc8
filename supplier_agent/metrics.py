"""``cloudgpu-agent run --metrics 127.0.0.1:9835``: the host's GPUs and the agent's own state
for Prometheus, off unless asked for.

The GPU series carry dcgm-exporter's names and labels (``DCGM_FI_DEV_GPU_UTIL{gpu, UUID,
modelName, Hostname}`` ...), so dashboards built for dcgm-exporter work unchanged; the values come
from NVML through the agent's own session (gpu.py), read when Prometheus scrapes, never from an
``nvidia-smi`` process. The agent's series are ``cloudgpu_agent_*``. prometheus_client's server
runs in a thread of its own: a slow scrape never holds the agent's event loop, and the NVML
calls it makes are the same thread-safe ones the heartbeat makes.

The listener binds where told; the default is loopback, since GPU telemetry tells anyone who can
read it what the host's renters are doing.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from supplier_agent.gpu import GpuQueryError, Nvml
from supplier_agent.gpu_health import HealthWatch
from supplier_agent.protocol import GpuHealth

log = logging.getLogger(__name__)

DEFAULT_PORT = 9835  # dcgm-exporter uses 9400; ours is another exporter on the same host
TEMPERATURE_GPU = 0
CLOCK_SM = 1
CLOCK_MEM = 2


class MetricsAddressError(ValueError):
    pass


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


def serve(address: str, collector: AgentCollector) -> Any:
    """Start the metrics listener in a thread; returns the server (``shutdown()`` stops it)."""
    from prometheus_client import start_http_server

    host, port = parse_address(address)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    log.info("metrics on http://%s:%d/metrics", host, port)
    return server
