"""Renters' volumes: create, mount into a lease, delete, and apply what agents report.

Deleting goes to the agent as a ``volume_delete`` frame (now if its host is connected, again on
each reconnect until the agent reports it removed); a volume no lease ever mounted exists on no
disk, so it is removed at once. Sizes and removals come back in ``volume_report`` frames,
applied idempotently: an agent repeats its removals for days, in case a report was lost.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac

from hub.accounts.models import User
from hub.leases.models import Lease
from hub.lib import channel_send
from hub.suppliers.models import Host
from hub.volumes.models import Volume
from supplier_agent.mount_paths import mount_path_refusal
from supplier_agent.protocol import VolumeDelete, VolumeReport, encode

log = logging.getLogger(__name__)

GIB = 1024**3
WIRE_PREFIX = "vol-"
# What a renter may call a volume: it is shown on pages and in the API, never sent to agents.
LABEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_MOUNTS = 4


class VolumeError(Exception):
    """A volume request was refused; the message is fit to show the renter."""


@dataclass(frozen=True)
class Mount:
    volume: Volume
    path: str


def _wire_name(volume_id: object) -> str:
    # Keyed with SECRET_KEY: the supplier cannot tell whose volume it is or link two of them.
    digest = salted_hmac("cloudgpu.volumes", str(volume_id), algorithm="sha256").hexdigest()
    return WIRE_PREFIX + digest[:40]


def create_volume(renter: User, host: Host, label: str, size_gib: int) -> Volume:
    label = (label or "").strip()
    if not LABEL_RE.match(label):
        raise VolumeError(
            "a volume name is 1-64 letters, digits, dots, dashes or underscores, "
            "starting with a letter or digit"
        )
    if not 1 <= size_gib <= settings.VOLUME_MAX_GIB:
        raise VolumeError(f"a volume's size is 1 to {settings.VOLUME_MAX_GIB} GiB")
    with transaction.atomic():
        # One at a time per renter, so the count below cannot be raced past.
        User.objects.select_for_update(no_key=True).only("pk").get(pk=renter.pk)
        live = Volume.objects.filter(renter=renter, kind=Volume.Kind.VOLUME).exclude(
            state=Volume.State.REMOVED
        )
        if live.count() >= settings.VOLUME_MAX_PER_RENTER:
            raise VolumeError(
                f"you have {settings.VOLUME_MAX_PER_RENTER} volumes already: delete one first"
            )
        volume = Volume(renter=renter, host=host, label=label, size_cap_bytes=size_gib * GIB)
        volume.wire_name = _wire_name(volume.id)
        try:
            with transaction.atomic():
                volume.save()
        except IntegrityError:
            raise VolumeError(f"you already have a volume called {label!r} on this host") from None
    return volume


def resize_volume(renter: User, volume_id: Any, size_gib: int) -> Volume:
    """A new size for the renter's volume. The way out of "over its size": a volume over its
    cap mounts into no rental (the agent refuses it too), so its owner could not get in to
    trim it; a larger size lets the next rental mount it. Takes effect with that rental."""
    if not 1 <= size_gib <= settings.VOLUME_MAX_GIB:
        raise VolumeError(f"a volume's size is 1 to {settings.VOLUME_MAX_GIB} GiB")
    with transaction.atomic():
        volume = Volume.objects.select_for_update().filter(pk=volume_id, renter=renter).first()
        if volume is None or volume.kind != Volume.Kind.VOLUME:
            raise VolumeError("no such volume")
        if volume.state != Volume.State.ACTIVE:
            raise VolumeError(f"volume {volume.label!r} was removed")
        volume.size_cap_bytes = size_gib * GIB
        # The last measurement against the new size; the host measures again within the hour.
        volume.over_cap = (
            volume.used_bytes is not None and volume.used_bytes > volume.size_cap_bytes
        )
        volume.save(update_fields=["size_cap_bytes", "over_cap"])
    return volume


def _mounted_by_active_lease(volume: Volume) -> bool:
    return Lease.objects.filter(
        state__in=Lease.ACTIVE_STATES, volumes__contains=[{"name": volume.wire_name}]
    ).exists()


def delete_volume(renter: User, volume_id: Any) -> Volume:
    """The renter's volume goes: at once if it never reached a disk, else via its agent."""
    with transaction.atomic():
        volume = Volume.objects.select_for_update().filter(pk=volume_id, renter=renter).first()
        if volume is None or volume.kind != Volume.Kind.VOLUME:
            raise VolumeError("no such volume")
        if volume.state != Volume.State.ACTIVE:
            return volume
        if _mounted_by_active_lease(volume):
            raise VolumeError("a rental of yours is using this volume: stop it first")
        if volume.first_mounted_at is None:
            volume.state = Volume.State.REMOVED
            volume.removed_reason = Volume.Reason.DELETED
            volume.removed_at = timezone.now()
            volume.save(update_fields=["state", "removed_reason", "removed_at"])
            return volume
        volume.state = Volume.State.DELETING
        volume.save(update_fields=["state"])
        channel = volume.host.channel_name
        frame = encode(VolumeDelete(name=volume.wire_name))
        if channel:
            transaction.on_commit(lambda: _send(channel, frame), robust=True)
    return volume


def _send(channel: str, frame: str) -> None:
    channel_send.send(channel, {"type": "agent.command", "frame": frame})


def pending_deletes(host_id: int) -> list[str]:
    """Frames to send an agent that (re)connects: the deletes it has not confirmed yet."""
    names = Volume.objects.filter(host_id=host_id, state=Volume.State.DELETING).values_list(
        "wire_name", flat=True
    )
    return [encode(VolumeDelete(name=name)) for name in names[:1000]]


def pending_deletes_of(host_ids: list[int]) -> list[tuple[int, str]]:
    """``pending_deletes`` for many hosts in one statement (a batch of registrations): (host
    id, frame) pairs, at most 1,000 per call."""
    rows = Volume.objects.filter(host_id__in=host_ids, state=Volume.State.DELETING).values_list(
        "host_id", "wire_name"
    )
    return [(host_id, encode(VolumeDelete(name=name))) for host_id, name in rows[:1000]]


# --- leases -----------------------------------------------------------------------------------


def mounts_for_lease(renter: User, host: Host, wanted: list[tuple[Any, str]]) -> list[Mount]:
    """The renter's volumes on this host, checked, for a lease to mount at the given paths."""
    if len(wanted) > MAX_MOUNTS:
        raise VolumeError(f"a rental mounts at most {MAX_MOUNTS} volumes")
    mounts = []
    for volume_id, path in wanted:
        volume = Volume.objects.filter(pk=volume_id, renter=renter, kind=Volume.Kind.VOLUME).first()
        if volume is None:
            raise VolumeError("no such volume")
        if volume.state != Volume.State.ACTIVE:
            raise VolumeError(f"volume {volume.label!r} was removed")
        if volume.host_id != host.pk:
            raise VolumeError(f"volume {volume.label!r} is on another host")
        if volume.over_cap:
            raise VolumeError(
                f"volume {volume.label!r} holds more than its size: give it a larger size "
                "(then delete files from it if you like) or delete it"
            )
        refusal = mount_path_refusal(path)
        if refusal is not None:
            # The agent's own rule, refused here in words rather than by the host at start.
            raise VolumeError(f"the mount path {_shown(path)} {refusal}")
        mounts.append(Mount(volume, path))
    if len({m.path for m in mounts}) != len(mounts) or len({m.volume.pk for m in mounts}) != len(
        mounts
    ):
        raise VolumeError("each volume once, each at its own path")
    return mounts


def _shown(path: object) -> str:
    """A refused path as the renter reads it: quoted, escapes visible, not a page long."""
    text = repr(path)
    return text if len(text) <= 80 else f"{text[:77]}..."


def wire_mounts(mounts: list[Mount]) -> list[dict[str, Any]]:
    return [
        {"name": m.volume.wire_name, "path": m.path, "size_bytes": m.volume.size_cap_bytes}
        for m in mounts
    ]


def note_mounted(lease: Lease, now: datetime) -> None:
    """A lease with volumes was granted: they exist on the host from now on (caches too)."""
    names = [v["name"] for v in lease.volumes or []]
    if not names and not lease.cache_volume:
        return  # most rentals: no statement at all in the rent's transaction
    # Locked and checked again in the lease's transaction: a delete racing this rent either
    # sees the lease (and refuses) or wins (and this rent is refused).
    volumes = list(Volume.objects.select_for_update().filter(wire_name__in=names))
    if len(volumes) != len(names) or any(
        v.state != Volume.State.ACTIVE or v.renter_id != lease.renter_id for v in volumes
    ):
        raise VolumeError("a volume of this rental was just deleted")
    Volume.objects.filter(wire_name__in=names, first_mounted_at__isnull=True).update(
        first_mounted_at=now
    )
    Volume.objects.filter(wire_name__in=names).update(last_used_at=now)
    if lease.cache_volume:
        cache, _ = Volume.objects.get_or_create(
            wire_name=lease.cache_volume["name"],
            defaults={
                "renter_id": lease.renter_id,
                "host_id": lease.host_id,
                "kind": Volume.Kind.CACHE,
                "label": lease.image[:64],
                "first_mounted_at": now,
            },
        )
        if cache.state == Volume.State.REMOVED:
            # The agent removed it (idle, disk) and this lease makes it afresh, empty.
            Volume.objects.filter(pk=cache.pk).update(
                state=Volume.State.ACTIVE, removed_reason="", removed_at=None, used_bytes=None
            )
        Volume.objects.filter(pk=cache.pk).update(last_used_at=now)


# --- agent reports ----------------------------------------------------------------------------


def _at(timestamp: float) -> datetime:
    return datetime.fromtimestamp(timestamp, tz=UTC)


def apply_report(host_id: int, report: VolumeReport) -> int:
    """Sizes and removals an agent reported for its host's volumes; names of other hosts'
    volumes (or none of ours) change nothing. Returns the number of volumes removed now."""
    now = timezone.now()
    by_name = {
        v.wire_name: v for v in Volume.objects.filter(host_id=host_id).exclude(state="removed")
    }
    for usage in report.volumes:
        volume = by_name.get(usage.name)
        if volume is None:
            continue
        Volume.objects.filter(pk=volume.pk).update(
            used_bytes=usage.bytes if usage.bytes >= 0 else None,
            in_use=usage.in_use,
            over_cap=usage.over_cap,
            measured_at=now,
        )
    removed = 0
    for removal in report.removed:
        volume = by_name.get(removal.name)
        if volume is None:
            continue
        removed += (
            Volume.objects.filter(pk=volume.pk)
            .exclude(state="removed")
            .update(
                state=Volume.State.REMOVED,
                removed_reason=removal.reason,
                removed_at=_at(removal.at) if removal.at > 0 else now,
                in_use=False,
            )
        )
        if removal.reason != Volume.Reason.DELETED:
            log.info("host %s removed volume %s (%s)", host_id, volume.pk, removal.reason)
    return removed
