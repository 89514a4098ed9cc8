"""The hub's Prometheus metrics: every counter, gauge and histogram the hub's processes update.

prometheus_client (the Prometheus project's own Python client) in its multiprocess mode: with
``PROMETHEUS_MULTIPROC_DIR`` set, each process (Daphne, the Celery worker and its children,
beat) writes its values into memory-mapped files in that folder, and ``/metrics``
(hub/health/metrics_view.py) adds them up. ``hub.runner serve`` sets the folder for every
process it starts and empties it first; docker-compose.yml shares one volume between its
containers. hub/lib/metrics_dir.py names each process's files so that processes of different
containers never share one, and folds dead processes' files into one archive. Without the
folder each process keeps its own values, which is what a test or a one-process hub needs.

Cardinality is bounded by construction: no label here takes a host, lease, user or command id,
or a GPU model name (the fleet gauges per model are computed at scrape time, top N plus
"other"). Every label's values are listed next to it. An increment is an in-process write to a
memory-mapped file under a per-value lock: no syscall, no file lock, safe on the heartbeat path.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from hub.lib import metrics_dir

# Before the first metric: its files must carry this process's identifier, not its pid.
metrics_dir.use_shared_folder()

# Handling takes milliseconds; the buckets resolve 0.5 ms to 2.5 s.
_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Commands round trip through Celery, the channel layer and an agent: 10 ms to 2 min.
_DISPATCH_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# A rental starts in seconds (cached image) to many minutes (a 20 GB pull).
_START_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
_BATCH_BUCKETS = (1, 5, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000)

# --- agents' sockets (web processes) ------------------------------------------------------------

AGENTS_CONNECTED = Gauge(
    "cloudgpu_agents_connected",
    "Agent sockets registered on this hub (summed over live web processes).",
    multiprocess_mode="livesum",
)
REGISTRATIONS = Counter(
    "cloudgpu_agent_registrations",
    "Agent registrations, by outcome (ok, refused).",
    ["outcome"],
)
HANDSHAKES_DROPPED = Counter(
    "cloudgpu_agent_handshakes_dropped",
    "New sockets' token checks and registrations dropped because the agent left while they "
    "waited for a batch (a reconnect storm's cut handshakes), by step (token, register).",
    ["step"],
)
HEARTBEATS = Counter("cloudgpu_heartbeats", "Heartbeats received from agents.")
HEARTBEAT_SECONDS = Histogram(
    "cloudgpu_heartbeat_handling_seconds",
    "Time from a heartbeat's frame parsed to its liveness stored (Redis, or Postgres without it).",
    buckets=_FAST_BUCKETS,
)

# --- the command outbox and leases --------------------------------------------------------------

DISPATCH_SECONDS = Histogram(
    "cloudgpu_command_ack_seconds",
    "Time from a command created to its ack arriving, by kind (reserve, docker_run, release).",
    ["kind"],
    buckets=_DISPATCH_BUCKETS,
)
COMMANDS_FINISHED = Counter(
    "cloudgpu_commands_finished",
    "Commands answered or given up, by kind and outcome (ok, refused, deadline).",
    ["kind", "outcome"],
)
RENT_TO_RUNNING_SECONDS = Histogram(
    "cloudgpu_lease_start_seconds",
    "Time from a rental created to its container running.",
    buckets=_START_BUCKETS,
)

# --- billing ------------------------------------------------------------------------------------

BILLING_TICKS = Counter("cloudgpu_billing_ticks", "Billing runs (the charge_and_release task).")
BILLING_CHARGED_MICROS = Counter(
    "cloudgpu_billing_charged_micros", "Money charged to renters, in micro-units of the currency."
)

# --- telemetry flush (beat's flush task, in the worker) -----------------------------------------

FLUSH_HOSTS = Histogram(
    "cloudgpu_telemetry_flush_hosts",
    "Hosts whose pending telemetry one flush wrote to Postgres.",
    buckets=_BATCH_BUCKETS,
)
FLUSH_SECONDS = Histogram(
    "cloudgpu_telemetry_flush_seconds",
    "Duration of one telemetry flush (Redis to Postgres).",
    buckets=_FAST_BUCKETS,
)

# --- GPU health ---------------------------------------------------------------------------------

GPU_DELISTINGS = Counter(
    "cloudgpu_gpu_delistings",
    "GPUs the hub took off the market because their agent reported a failure, by cause "
    "(xid, ecc, lost, thermal).",
    ["cause"],
)

# --- errors -------------------------------------------------------------------------------------

STORE_ERRORS = Counter(
    "cloudgpu_store_errors",
    "Errors talking to Redis or Postgres that the hub survived, by store (redis, postgres).",
    ["store"],
)


# Every label value a counter can take exists from the start, at 0: Prometheus' increase() and
# rate() need a series before its first event, or an alert on "any delisting" misses the first.
for _outcome in ("ok", "refused"):
    REGISTRATIONS.labels(_outcome)
for _kind in ("reserve", "docker_run", "release"):
    for _outcome in ("ok", "refused", "deadline"):
        COMMANDS_FINISHED.labels(_kind, _outcome)
for _cause in ("xid", "ecc", "lost", "thermal"):
    GPU_DELISTINGS.labels(_cause)
for _store in ("redis", "postgres"):
    STORE_ERRORS.labels(_store)
