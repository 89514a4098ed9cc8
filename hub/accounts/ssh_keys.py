"""A person's SSH public keys: add (checked, no duplicates, at most MAX_PER_ACCOUNT), delete.

Deleting a key is immediate for new logins: the gateway's sshd asks the hub at every login
(hub/tunnels/renter_ssh.py), so the next one with that key finds nothing.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from hub.accounts.models import SshKey, User
from hub.lib.ssh_keys import BadPublicKey, parse_public_key
from hub.notifications.events import emit

MAX_PER_ACCOUNT = 10
# last_used_at is for people ("used today?"): at most one write a minute per key.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class SshKeyError(Exception):
    """The key cannot be added; the message is a sentence for the person."""


def add_ssh_key(user: User, text: str) -> SshKey:
    try:
        key = parse_public_key(text)
    except BadPublicKey as exc:
        raise SshKeyError(str(exc)) from None
    with transaction.atomic():
        # The person's row lock: two adds at once cannot both pass the cap.
        User.objects.select_for_update(no_key=True).only("pk").get(pk=user.pk)
        if SshKey.objects.filter(fingerprint=key.fingerprint).exists():
            # Also another account's: one key opens one account's rentals (see the model).
            raise SshKeyError(f"this key ({key.fingerprint}) is already added to an account")
        if SshKey.objects.filter(user=user).count() >= MAX_PER_ACCOUNT:
            raise SshKeyError(f"an account holds at most {MAX_PER_ACCOUNT} SSH keys: delete one")
        try:
            with transaction.atomic():
                added = SshKey.objects.create(
                    user=user,
                    key_type=key.key_type,
                    blob=key.blob,
                    comment=key.comment,
                    fingerprint=key.fingerprint,
                )
        except IntegrityError:  # another account added it between the check and the insert
            raise SshKeyError(
                f"this key ({key.fingerprint}) is already added to an account"
            ) from None
        # In the add's transaction: a key that opens the account's rentals never arrives
        # unannounced.
        emit(
            user.pk,
            "security.ssh_key_added",
            {"fingerprint": added.fingerprint, "comment": added.comment},
        )
        return added


def delete_ssh_key(user: User, key_id: int) -> bool:
    """Delete one of the person's keys; False when they have none with that id."""
    deleted, _ = SshKey.objects.filter(pk=key_id, user=user).delete()
    return deleted > 0


def note_used(key: SshKey) -> None:
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        SshKey.objects.filter(pk=key.pk).update(last_used_at=now)


def authorized_keys_lines(user: User) -> list[str]:
    """The person's keys as authorized_keys lines, newest first."""
    return [key.line for key in SshKey.objects.filter(user=user)]
