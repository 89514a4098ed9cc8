from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import AbstractUser
from django.contrib.postgres.fields import ArrayField
from django.db import models


class User(AbstractUser):
    """One account for every person: a renter, a supplier, or both; admins are staff.

    A project-owned user model from the first migration, because swapping it later is painful.
    """


class ApiScope(models.TextChoices):
    """What an API token may do (hub/api/permissions.py checks them).

    ``tokens`` is its own scope, apart from ``read``: a token that can list, mint or revoke tokens
    can outlive its own revocation by minting a successor, so it is granted only on purpose.
    """

    READ = "read", "read: see offers, templates, your leases and account"
    LEASES = "leases", "leases: start and stop leases, get their access tokens"
    TOKENS = "tokens", "tokens: list, create and revoke API tokens"
    # Opt-in like ``tokens``: it asks for money to leave the marketplace.
    PAYOUTS = "payouts", "payouts: request and cancel payouts of your earnings"
    # Opt-in too: a leaked renter's token must not reprice or relist a supplier's GPUs.
    HOSTS = "hosts", "hosts: price and list your GPUs, and set their disk allowance"


# What a new token gets unless asked otherwise: enough to rent from a script, not enough to mint
# a successor when it leaks.
DEFAULT_API_SCOPES = (ApiScope.READ.value, ApiScope.LEASES.value)


def default_api_scopes() -> list[str]:
    return list(DEFAULT_API_SCOPES)


class ApiToken(models.Model):
    """A renter's credential for the REST API (``Authorization: Bearer cgpr_...``).

    Like agent tokens, only a SHA-256 digest is stored: the token carries ~178 random bits, so a
    fast hash is enough and a lookup stays one indexed query (hub/accounts/api_tokens.py).
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    # The visible start of the token ("cgpr_3fa9c1"), so a renter can tell tokens apart.
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    scopes = ArrayField(
        models.CharField(max_length=16, choices=ApiScope.choices), default=default_api_scopes
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # The database refuses a scope the code does not know, so a typo written by any
            # path (a shell, a future migration) cannot grant or hide a power.
            models.CheckConstraint(
                condition=models.Q(scopes__contained_by=ApiScope.values),
                name="api_token_scopes_known",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'})"

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


class SshKey(models.Model):
    """A public key the person logs in with: through the tunnel gateway to their own running
    rentals' ports (hub/tunnels/renter_ssh.py), and into templates that take the account's keys
    (hub/catalog/services.py). The public half only; the hub never sees a private key."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys"
    )
    key_type = models.CharField(max_length=32)
    blob = models.TextField()  # base64, as pasted
    comment = models.CharField(max_length=100, blank=True)
    # OpenSSH's "SHA256:<base64>": unique across accounts, because the gateway's sshd looks a
    # key up by it alone and one key must open one account's rentals, never two.
    fingerprint = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.key_type} {self.fingerprint} ({self.comment or 'no comment'})"

    @property
    def line(self) -> str:
        return f"{self.key_type} {self.blob} {self.comment}".rstrip()
