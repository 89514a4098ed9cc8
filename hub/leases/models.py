"""Leases (a renter's use of GPUs on one host) and the command outbox to agents."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db import models

from hub.suppliers.models import Gpu, Host


class Lease(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"
        RESERVING = "reserving"
        STARTING = "starting"
        RUNNING = "running"
        STOPPING = "stopping"
        ENDED = "ended"
        FAILED = "failed"

    class EndReason(models.TextChoices):
        RENTER_STOP = "renter_stop"
        EXPIRED = "expired"
        NO_FUNDS = "no_funds"
        HOST_LOST = "host_lost"
        ADMIN = "admin"
        ERROR = "error"
        EXITED = "exited"
        OUT_OF_MEMORY = "out_of_memory"
        # The agent stopped it for its disk use: over its allowance, or the biggest writer
        # when the host's free disk reached its supplier's floor.
        DISK = "disk", "Disk Allowance"

    ACTIVE_STATES = (
        State.PENDING,
        State.RESERVING,
        State.STARTING,
        State.RUNNING,
        State.STOPPING,
    )

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    renter = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="leases"
    )
    host = models.ForeignKey(Host, on_delete=models.PROTECT, related_name="leases")
    gpus = models.ManyToManyField(Gpu, through="LeaseGpu", related_name="leases")
    state = models.CharField(
        max_length=16, choices=State.choices, default=State.PENDING, db_index=True
    )
    end_reason = models.CharField(max_length=16, choices=EndReason.choices, blank=True)
    # Words a renter understands: "image not found", "the host went away", ...
    failure_reason = models.TextField(blank=True)
    # Fencing: grows each time GPUs are granted (one global sequence, so also per GPU).
    epoch = models.BigIntegerField(unique=True)
    image = models.CharField(max_length=512)
    ports = models.JSONField(default=list, blank=True)
    env = models.JSONField(default=dict, blank=True)
    command = models.JSONField(null=True, blank=True)
    entrypoint = models.JSONField(null=True, blank=True)
    user = models.CharField(max_length=64, blank=True)
    cache_volume = models.JSONField(null=True, blank=True)
    # The renter's own volumes it mounts: [{"name": "vol-…", "path": "/data", "size_bytes": n}].
    volumes = models.JSONField(default=list, blank=True)
    warmup = models.JSONField(null=True, blank=True)
    # The renter's choice: its tunnel URLs need the lease's access token (hub/tunnels/access.py).
    access_protected = models.BooleanField(default=False)
    container_id = models.CharField(max_length=128, blank=True)
    # What the container runs, pinned (the agent's ack): "<repository>@sha256:…" as pulled from
    # its registry for this lease, or "sha256:<id>" of an image the supplier rents out from
    # their own host (allow_local_images). Empty before running, and from older agents.
    image_digest = models.CharField(max_length=300, blank=True)
    host_ports = models.JSONField(default=dict, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    log_tail = models.TextField(blank=True)
    warnings = models.JSONField(default=list, blank=True)
    # Set while the host is offline; past the grace period the lease ends with host_lost.
    host_lost_since = models.DateTimeField(null=True, blank=True)
    # Total time the host was away while this lease went on: never billed.
    offline_duration = models.DurationField(default=timedelta(0))
    foreign_process_seen_at = models.DateTimeField(null=True, blank=True)
    # Set when one of the lease's GPUs failed under it (hub/leases/gpu_faults.py): the lease
    # goes on (the renter decides), and the renter sees why its results may be wrong.
    gpu_fault_at = models.DateTimeField(null=True, blank=True)
    gpu_fault_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    running_since = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Money (hub/billing): the terms are fixed when the lease starts, so a supplier changing a
    # price or an admin changing the fee never changes a running lease.
    price_per_hour_micros = models.BigIntegerField(default=0)
    # Likewise what it may write on the host: its GPUs' allowances summed at the start (null:
    # leased before allowances existed; the agent applies its own default).
    disk_allowance_bytes = models.BigIntegerField(null=True, blank=True)
    platform_fee_bps = models.PositiveIntegerField(default=0)
    # Metering cursor: the total charged so far, and the instant that total runs up to. The
    # ledger is the truth for balances; this only says how much of the lease is already billed.
    charged_micros = models.BigIntegerField(default=0)
    billed_until = models.DateTimeField(null=True, blank=True)
    # Set once the lease ended and was charged up to its end: metering never looks at it again.
    billing_settled_at = models.DateTimeField(null=True, blank=True)
    # Set while the renter's balance covers less than BILLING_WARN_MINUTES of their burn.
    funds_warning_at = models.DateTimeField(null=True, blank=True)
    # When the renter (or an admin, the keep-alive limit or the funds sweep) asked it to stop:
    # billing ends here, whatever the host does with the release afterwards.
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # The renter's keep-alive limit: a beat sweep releases the lease (expired) at this time.
    stop_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The host-lost sweep looks only at leases waiting out a grace period.
            models.Index(
                fields=["host_lost_since"],
                condition=models.Q(host_lost_since__isnull=False),
                name="lease_host_lost_idx",
            ),
            # The metering sweep: leases that ran and are not settled yet, stalest first.
            models.Index(
                fields=["billed_until"],
                condition=models.Q(running_since__isnull=False, billing_settled_at__isnull=True),
                name="lease_unsettled_idx",
            ),
            # The keep-alive sweep: leases with a limit that are still going.
            models.Index(
                fields=["stop_at"],
                condition=models.Q(
                    stop_at__isnull=False,
                    state__in=["pending", "reserving", "starting", "running"],
                ),
                name="lease_stop_at_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"lease {self.id} ({self.state})"

    @property
    def active(self) -> bool:
        return self.state in self.ACTIVE_STATES


class LeaseGpu(models.Model):
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="lease_gpus")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="lease_gpus")
    # True while the lease holds the GPU; the partial unique index makes a double grant of one
    # GPU impossible even if two transactions race past every other check.
    active = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu"], condition=models.Q(active=True), name="one_active_lease_per_gpu"
            )
        ]

    def __str__(self) -> str:
        return f"{self.gpu_id} in {self.lease_id}"


class Command(models.Model):
    """The outbox: every command to an agent is a row first, sent by a Celery task after commit."""

    class Kind(models.TextChoices):
        RESERVE = "reserve"
        DOCKER_RUN = "docker_run"
        RELEASE = "release"

    class State(models.TextChoices):
        QUEUED = "queued"
        SENT = "sent"
        ACKED = "acked"
        FAILED = "failed"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="commands")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="commands")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    payload = models.JSONField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.QUEUED)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    deadline = models.DateTimeField()
    ok = models.BooleanField(null=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    acked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(state__in=["queued", "sent"]),
                name="command_pending_idx",
            )
        ]
        ordering = ["created_at"]

    def __str__(self) -> str:
        return f"{self.kind} {self.id} ({self.state})"


class ExecSession(models.Model):
    """A terminal or command a person ran in a lease's container (docker exec on its host):
    who, when, how long, how it ended. Never what was typed or printed."""

    class Via(models.TextChoices):
        WEB = "web", "lease page"
        API = "api", "API"
        CLI = "cli", "admin CLI"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="exec_sessions")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="exec_sessions"
    )
    via = models.CharField(max_length=8, choices=Via.choices)
    # The command of a one-shot exec; empty for an interactive shell.
    command = models.JSONField(default=list, blank=True)
    opened_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    # Why it ended when it did not exit by itself: refused, the renter left, the host went away.
    end_reason = models.CharField(max_length=300, blank=True)

    class Meta:
        indexes = [models.Index(fields=["lease", "-opened_at"])]

    def __str__(self) -> str:
        return f"exec {self.id} on lease {self.lease_id} by {self.user_id}"
