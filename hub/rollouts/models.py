"""A staged rollout of an agent release over the fleet (docs/operators.md, "Rolling out an
agent release"): its waves, and where each host stands in it."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from hub.suppliers.models import Host


class Rollout(models.Model):
    class State(models.TextChoices):
        RUNNING = "running"
        PAUSED = "paused"  # by an admin, or by itself: ``reason`` says which and why
        DONE = "done"  # every wave went out; hosts still pending join when they connect
        ABORTED = "aborted"

    ACTIVE_STATES = (State.RUNNING, State.PAUSED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    version = models.CharField(max_length=64)
    # Cumulative shares of the fleet, in percent, one per wave after the named hosts' (if any):
    # [1, 10, 50, 100] upgrades 1 % of the hosts, then up to 10 %, ...
    percents = models.JSONField(default=list)
    named_first = models.BooleanField(default=False)  # wave 1 is the hosts the admin named
    pause_s = models.PositiveIntegerField(default=600)  # between a healthy wave and the next
    # Upgrade hosts even in a rental's first minutes (ROLLOUT_FRESH_RENTAL_S).
    force = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    reason = models.TextField(blank=True)  # why it paused or stopped
    wave = models.PositiveSmallIntegerField(default=0)  # the wave under way; 0: none yet
    wave_started_at = models.DateTimeField(null=True, blank=True)
    # Set once the wave under way has settled healthy: the next one starts then.
    next_wave_at = models.DateTimeField(null=True, blank=True)
    # Paused by the verdict (not by an admin): resuming accepts that wave's failures.
    self_paused = models.BooleanField(default=False)
    # A wave whose failures an admin accepted by resuming: not judged again.
    accepted_wave = models.PositiveSmallIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"rollout of {self.version} ({self.state})"

    @property
    def waves(self) -> int:
        return len(self.percents) + (1 if self.named_first else 0)


class RolloutHost(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"  # its wave has not come, or it was offline or busy when it did
        SENT = "sent"  # told to upgrade; waiting for it to come back at the version
        UPGRADED = "upgraded"  # registered at the version; watched until the wave settles
        FAILED = "failed"  # ``detail`` says how
        ROLLING_BACK = "rolling_back"
        ROLLED_BACK = "rolled_back"
        LEFT_BEHIND = "left_behind"  # cannot take part (``detail``): upgrade it by hand

    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="hosts")
    host = models.ForeignKey(Host, on_delete=models.CASCADE, related_name="rollouts")
    wave = models.PositiveSmallIntegerField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    from_version = models.CharField(max_length=64, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    upgraded_at = models.DateTimeField(null=True, blank=True)
    detail = models.TextField(blank=True)
    # While watched: the socket it was last seen on, and how many new ones it came back on
    # since (each restart of the agent is a new connection): a crash loop shows here before
    # the offline sweep would see it, if ever (a quick restart beats the offline deadline).
    channel = models.CharField(max_length=200, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["rollout", "host"], name="rollout_host_once"),
        ]
        indexes = [models.Index(fields=["rollout", "wave", "state"], name="rollout_wave_state")]

    def __str__(self) -> str:
        return f"{self.host_id} in {self.rollout_id}: {self.state}"
