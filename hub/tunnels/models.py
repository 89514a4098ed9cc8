"""Tunnels: each declared container port of a lease is published at ``<public_id>-i.<domain>``.

The agent opens ``ssh -R 127.0.0.1:<listen_port>:...`` to the gateway with a key made for the
lease; the gateway's sshd asks the hub which ports that key may listen on, and its edge proxy
asks the hub which port a host name maps to.
"""

from __future__ import annotations

from django.db import models

from hub.leases.models import Lease


class Tunnel(models.Model):
    class State(models.TextChoices):
        PENDING = "pending"  # allocated; the agent has not opened it yet
        UP = "up"  # the gateway accepted the agent's forward
        DOWN = "down"  # the agent's ssh is reconnecting
        CLOSED = "closed"  # the lease is over; the id answers 404

    lease = models.ForeignKey(Lease, on_delete=models.CASCADE, related_name="tunnels")
    # The DNS label before "-i.": random, lower case, never reused.
    public_id = models.CharField(max_length=32, unique=True)
    container_port = models.PositiveIntegerField()
    listen_port = models.PositiveIntegerField()
    state = models.CharField(max_length=8, choices=State.choices, default=State.PENDING)
    detail = models.CharField(max_length=512, blank=True)
    state_changed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True, blank=True, db_index=True)

    class Meta:
        ordering = ["lease", "container_port"]
        constraints = [
            # Two open tunnels can never share a gateway port, even if allocations race.
            models.UniqueConstraint(
                fields=["listen_port"],
                condition=models.Q(closed_at__isnull=True),
                name="one_open_tunnel_per_listen_port",
            ),
            models.UniqueConstraint(
                fields=["lease", "container_port"], name="one_tunnel_per_lease_port"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.public_id} -> :{self.container_port} ({self.state})"


class TunnelKey(models.Model):
    """The public half of the key the agent made for one lease (sent in its docker_run ack)."""

    lease = models.OneToOneField(Lease, on_delete=models.CASCADE, related_name="tunnel_key")
    public_key = models.TextField()
    # OpenSSH's "SHA256:<base64>" of the key blob: what sshd's lookup is keyed by.
    fingerprint = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.fingerprint} for lease {self.lease_id}"
