"""Suppliers' side of the market: agent tokens, hosts, their GPUs, and host transitions."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

import supplier_agent
from hub.lib.versions import is_older


class AgentToken(models.Model):
    """A supplier's credential for agents. Only a SHA-256 digest is stored: tokens carry
    160+ bits of randomness, so a fast hash is enough and lookups stay one indexed query."""

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agent_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    # The visible start of the token ("cgpu_3fa9c1"), so a supplier can tell tokens apart.
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # What GPUs of hosts joining with this token are listed at when first seen (unless their
    # host has a default of its own); None: unlisted until priced.
    default_price_per_hour_micros = models.BigIntegerField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


def short_host_id(agent_id: uuid.UUID | str | None) -> str:
    """The agent id's first characters: enough to tell a supplier's hosts apart at a glance."""
    if not agent_id:
        return ""
    return (agent_id.hex if isinstance(agent_id, uuid.UUID) else str(agent_id).replace("-", ""))[:6]


def host_label(name: str, hostname: str, agent_id: uuid.UUID | str | None) -> str:
    """For rows read with ``values()``: what ``Host.label`` says."""
    return f"{name or hostname} · {short_host_id(agent_id)}"


class Host(models.Model):
    class Status(models.TextChoices):
        ONLINE = "online"
        OFFLINE = "offline"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="hosts"
    )
    token = models.ForeignKey(
        AgentToken, null=True, blank=True, on_delete=models.SET_NULL, related_name="hosts"
    )
    agent_id = models.UUIDField(unique=True)
    hostname = models.CharField(max_length=255)
    # The supplier's name for the host (empty: its hostname); shown with the short id, since
    # two machines named "vm" must still be told apart.
    name = models.CharField(max_length=64, blank=True)
    # Where the host is, as its supplier says ("DE", "US-East"): renters filter by it.
    location = models.CharField(max_length=64, blank=True)
    os = models.CharField(max_length=255, blank=True)
    arch = models.CharField(max_length=32, blank=True)
    cpu_model = models.CharField(max_length=255, blank=True)
    cpu_count = models.PositiveIntegerField(default=1)
    ram_bytes = models.BigIntegerField(default=0)
    # Reported by agents that measure them (register and heartbeat; older agents: unknown).
    disk_free_bytes = models.BigIntegerField(null=True, blank=True)
    driver_version = models.CharField(max_length=32, blank=True)
    cuda_version = models.CharField(max_length=16, blank=True)
    # The hub's own measure of the agent's socket: the last ping-to-pong round trip.
    rtt_ms = models.PositiveIntegerField(null=True, blank=True)
    agent_version = models.CharField(max_length=64, blank=True)
    # cuda_version as a number (hub/lib/versions.py version_number): offers filter on it in SQL.
    cuda_key = models.IntegerField(default=0)
    # The share of the last 7 days online, refreshed by the beat (hub/catalog/uptime.py) every
    # UPTIME_REFRESH_S: offers filter and sort on it without reading every host's history.
    uptime_7d = models.FloatField(default=1.0)
    runtime = models.CharField(max_length=16, default="docker")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OFFLINE)
    # No new leases while set; running ones are untouched.
    maintenance = models.BooleanField(default=False)
    # Conservative deadline kept in Postgres (refreshed at most every stats interval); the
    # precise one lives in Redis (see hub/suppliers/liveness.py).
    # Not indexed: every heartbeat-side write changes it, and an index on it would make each of
    # those updates non-HOT (a new index entry per write). The offline sweep reads Redis first;
    # its Postgres fallback scans online hosts, which is cheap at fleet sizes.
    offline_after = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # The Channels channel of the connection that holds this host's agent, if any.
    channel_name = models.CharField(max_length=200, blank=True)
    # Set while a release on this host has failed for longer than RELEASE_STUCK_AFTER_S: the host
    # takes no new rentals until the stuck lease lets go; the reason is the agent's last error.
    release_stuck_since = models.DateTimeField(null=True, blank=True)
    release_stuck_reason = models.TextField(blank=True)
    # The price a GPU this host reports for the first time gets, and is listed at; without one a
    # new GPU stays unlisted until its owner prices it.
    default_price_per_hour_micros = models.BigIntegerField(null=True, blank=True)
    # Which machine speaks for this agent id (a hash of its /etc/machine-id; empty: unknown).
    machine_id = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.label

    @property
    def display_name(self) -> str:
        return self.name or self.hostname

    @property
    def short_id(self) -> str:
        return short_host_id(self.agent_id)

    @property
    def label(self) -> str:
        """How every page names the host: its name and short id ("vm · 3fa9c1")."""
        return host_label(self.name, self.hostname, self.agent_id)

    @property
    def agent_outdated(self) -> bool:
        """Older than the agent this hub serves to installers (`cloudgpu-agent upgrade`)."""
        return is_older(self.agent_version, supplier_agent.__version__)


def default_disk_allowance_bytes() -> int:
    """A new GPU's disk allowance until its supplier sets one (read when the row is built, so a
    changed setting reaches GPUs seen from then on, never ones already known)."""
    return int(settings.GPU_DISK_ALLOWANCE_DEFAULT_BYTES)


class Gpu(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=96)
    name = models.CharField(max_length=255)
    memory_total_bytes = models.BigIntegerField(default=0)
    memory_used_bytes = models.BigIntegerField(default=0)
    utilization_pct = models.PositiveSmallIntegerField(default=0)
    processes = models.JSONField(default=list, blank=True)
    listed = models.BooleanField(default=True)
    price_per_hour_micros = models.BigIntegerField(default=0)
    # False until its owner set a price (or the host's default applied): an unpriced GPU can
    # be neither listed nor rented, so a new GPU is never for rent at $0 by accident.
    priced = models.BooleanField(default=True)
    # What a rental of this GPU may write on the host (writable layer, cache, volumes); a lease
    # keeps the sum of its GPUs' from its start (hub/lib/disk_allowance.py has the bounds).
    disk_allowance_bytes = models.BigIntegerField(default=default_disk_allowance_bytes)
    # Set when a heartbeat shows compute processes on this GPU that are not its lease's.
    foreign_process_seen_at = models.DateTimeField(null=True, blank=True)
    present = models.BooleanField(default=True)
    # Set when the hub delisted this GPU for a failure its agent reported (an XID, uncorrected
    # ECC errors, fallen off the bus: hub/leases/gpu_faults.py); the reason says which. Its
    # supplier relisting it (set_gpu_terms, listed) clears both: "fixed, rent it again".
    unhealthy_since = models.DateTimeField(null=True, blank=True)
    unhealthy_reason = models.TextField(blank=True)
    stats_updated_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "index"], name="gpu_unique_host_index")
        ]
        ordering = ["host_id", "index"]
        indexes = [
            # The offers query (hub/catalog/offers.py): the rentable GPUs by price, so the
            # cheapest page is read in order instead of sorting the whole market.
            models.Index(
                fields=["price_per_hour_micros", "id"],
                condition=models.Q(listed=True, priced=True, present=True),
                name="gpu_offer_by_price",
            ),
            # ... and for the other sorts (catalog.offers.SORTS), likewise.
            models.Index(
                models.F("memory_total_bytes").desc(),
                "price_per_hour_micros",
                "id",
                condition=models.Q(listed=True, priced=True, present=True),
                name="gpu_offer_by_vram",
            ),
            models.Index(
                fields=["name", "price_per_hour_micros", "id"],
                condition=models.Q(listed=True, priced=True, present=True),
                name="gpu_offer_by_model",
            ),
        ]

    def __str__(self) -> str:
        return f"GPU {self.index} {self.name} on {self.host.label}"


class HostTransition(models.Model):
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="transitions")
    from_status = models.CharField(max_length=16)
    to_status = models.CharField(max_length=16)
    reason = models.CharField(max_length=200, blank=True)
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-at"]

    def __str__(self) -> str:
        return f"{self.host_id}: {self.from_status} -> {self.to_status}"


class GpuSample(models.Model):
    """A GPU's utilisation and memory at one telemetry write: the dashboard's sparklines.
    Written with the host's stats (on change, or every stats interval), pruned after a day."""

    RETENTION_HOURS = 24

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField()
    utilization_pct = models.PositiveSmallIntegerField()
    memory_used_bytes = models.BigIntegerField()
    memory_total_bytes = models.BigIntegerField()

    class Meta:
        ordering = ["gpu_id", "at"]
        indexes = [models.Index(fields=["gpu", "at"], name="gpusample_gpu_at_idx")]

    def __str__(self) -> str:
        return f"{self.gpu_id} at {self.at:%H:%M:%S}: {self.utilization_pct}%"
