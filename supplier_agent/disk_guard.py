"""What rentals write on the supplier's disk, measured and bounded (issue 33 item 1).

Every rental has a disk allowance (the hub sends the sum of its GPUs', set by the supplier):
its container's writable layer, its cache volume and its own volumes together. Docker bounds
none of these by default, and a renter's ``dd`` writes ~400 MiB/s: a host fills in minutes.

Where Docker's storage driver takes a size limit (overlay2 on xfs mounted with ``pquota``),
containers.py sets ``--storage-opt size=`` for the writable layer as well. Everywhere, this
guard measures each rental's files (``st_blocks``, hard links once) every ``interval_s``, and
sooner when the host's free space (one ``statvfs`` a ``tick_s``) has fallen by more than the
smallest rental's headroom since the last pass, so that a full-speed writer is caught within
about a tick of writing after it crosses its allowance (MARGIN_BYTES says how much the README
promises). At WARN_FRACTION of its allowance the renter is told; past it, the container is
killed and the lease ends with the reason on its page.

Host-wide: while the free space is below the supplier's floor plus the guard band, the agent
takes no new rentals, and the rental that wrote the most since the last pass is stopped, so a
writer never takes the host below the floor.

A pass costs a ``stat`` per file of the rentals; MAX_FILES bounds it (a rental with more files
than that is stopped: an inode bomb fills a disk as surely as bytes do).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import requests
from docker.errors import DockerException, NotFound

log = logging.getLogger("cloudgpu.agent.disk")

GIB = 1024**3
MIB = 1024**2
LABEL_ALLOWANCE = "cloudgpu.disk.allowance"
DEFAULT_ALLOWANCE_BYTES = 50 * GIB
WARN_FRACTION = 0.9
# The rental's files measured at most this often, and the host's free space this often.
INTERVAL_S = 10.0
TICK_S = 1.0
# A pass comes early when the host's free space fell by this much (or by the smallest
# headroom, when less) since the last one.
TRIGGER_BYTES = 256 * MIB
MIN_TRIGGER_BYTES = 32 * MIB
# What a full-speed writer may overshoot by (README): the trigger, plus a tick and a pass of
# writing at ~400 MiB/s.
MARGIN_BYTES = 1 * GIB
# Above the supplier's floor: the free space at which the biggest writer is stopped, so that
# it never reaches the floor itself.
GUARD_BAND_BYTES = 1 * GIB
# A rental counts as a writer when it grew by this much since the last pass.
WRITER_BYTES = 16 * MIB
MAX_FILES = 1_000_000

Send = Callable[[str, str, str], None]  # (lease id, cause or "", sentence)


def fmt_bytes(value: int) -> str:
    if value >= GIB:
        return f"{value / GIB:.1f} GiB"
    return f"{value / MIB:.0f} MiB"


@dataclass
class Rental:
    """One running lease's container, as the guard follows it."""

    lease_id: str
    container_id: str
    allowance: int
    paths: list[str]  # host folders holding its writable layer and volumes
    size_rw: bool = False  # no folder for its layer: Docker's own SizeRw (slower) counts it
    used: int = 0
    files: int = 0
    grew: int = 0  # since the pass before
    measured: bool = False
    warned: bool = False


@dataclass
class Usage:
    bytes: int = 0
    files: int = 0
    seen: set[tuple[int, int]] = field(default_factory=set)


def measure_tree(path: str, usage: Usage, limit: int = MAX_FILES) -> None:
    """Add the disk blocks of everything under ``path`` (itself included) to ``usage``; stop
    counting files past ``limit``. Hard links count once; files vanishing meanwhile, never."""
    stack = [path]
    while stack and usage.files <= limit:
        folder = stack.pop()
        try:
            entries = os.scandir(folder)
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                usage.files += 1
                if usage.files > limit:
                    return
                if info.st_nlink > 1 and not entry.is_dir(follow_symlinks=False):
                    key = (info.st_dev, info.st_ino)
                    if key in usage.seen:
                        continue
                    usage.seen.add(key)
                usage.bytes += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)


class DiskGuard:
    """Measures the rentals of one agent (containers labelled with its claim) and stops
    those that write too much. ``watch`` blocks: the agent runs it in a thread."""

    def __init__(
        self,
        client: Any,
        root: str,
        *,
        claim_label: str,
        lease_label: str,
        agent_id: str,
        floor_bytes: int,
        stop_container: Callable[[str], None],
        interval_s: float = INTERVAL_S,
        tick_s: float = TICK_S,
        max_files: int = MAX_FILES,
    ) -> None:
        self.client = client
        self.root = root
        self.claim_label = claim_label
        self.lease_label = lease_label
        self.agent_id = agent_id
        self.floor_bytes = floor_bytes
        self.stop_container = stop_container
        self.interval_s = interval_s
        self.tick_s = tick_s
        self.max_files = max_files
        self.rentals: dict[str, Rental] = {}
        # Read by the runtime before each rental: below floor + band it takes none.
        self.low_disk = False
        self.last_pass_s = 0.0  # what the last pass cost, for the log and the benchmark
        self._free_at_pass: int | None = None
        self._lock = threading.Lock()

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.root).free

    def refusal(self) -> str | None:
        """Why a new rental may not start now, or None."""
        try:
            free = self.free_bytes()
        except OSError:
            return None
        if free < self.floor_bytes + GUARD_BAND_BYTES:
            self.low_disk = True
            return (
                f"this host's disk has {fmt_bytes(free)} free, at its supplier's floor of "
                f"{fmt_bytes(self.floor_bytes)}: it takes no new rentals until space is freed"
            )
        return None

    # --- the loop ---------------------------------------------------------------------------

    def watch(self, send: Send, stop: threading.Event) -> None:
        next_pass = 0.0
        while not stop.is_set():
            try:
                free = self.free_bytes()
            except OSError as exc:
                log.warning("cannot read the free disk space at %s: %s", self.root, exc)
                stop.wait(self.interval_s)
                continue
            now = time.monotonic()
            if now >= next_pass or self._falling_fast(free):
                try:
                    self.check(send, free)
                except (DockerException, requests.RequestException, OSError) as exc:
                    log.warning("measuring the rentals' disk use failed: %s", exc)
                next_pass = time.monotonic() + self.interval_s
            stop.wait(self.tick_s)

    def _falling_fast(self, free: int) -> bool:
        if self._free_at_pass is None:
            return True
        headroom = min(
            (max(0, r.allowance - r.used) for r in self.rentals.values()),
            default=TRIGGER_BYTES,
        )
        fallen = self._free_at_pass - free
        low = free < self.floor_bytes + GUARD_BAND_BYTES + TRIGGER_BYTES
        # Never below MIN_TRIGGER_BYTES: a rental at its allowance's edge must not turn the
        # host's ordinary disk noise into a pass a second.
        return fallen >= max(MIN_TRIGGER_BYTES, min(TRIGGER_BYTES, headroom)) or (
            low and fallen > 0
        )

    def check(self, send: Send, free: int | None = None) -> None:
        """One pass: measure every rental, warn, stop what is over; then the host's floor."""
        with self._lock:
            started = time.monotonic()
            self._follow()
            for rental in list(self.rentals.values()):
                self._measure(rental)
                self._judge(rental, send)
            self.last_pass_s = time.monotonic() - started
            free = self.free_bytes() if free is None else free
            self._free_at_pass = free
            self.low_disk = free < self.floor_bytes + GUARD_BAND_BYTES
            if self.low_disk:
                self._stop_biggest_writer(send, free)

    def _follow(self) -> None:
        """The agent's running containers: new ones inspected once for their folders."""
        rows = self.client.api.containers(
            filters={"label": f"{self.claim_label}={self.agent_id}", "status": "running"}
        )
        running = {row["Id"]: row for row in rows}
        for container_id in set(self.rentals) - set(running):
            del self.rentals[container_id]
        for container_id, row in running.items():
            if container_id in self.rentals:
                continue
            try:
                attrs = self.client.api.inspect_container(container_id)
            except NotFound:
                continue
            labels = row.get("Labels") or {}
            self.rentals[container_id] = _rental(
                container_id, labels.get(self.lease_label, ""), labels, attrs
            )

    def _measure(self, rental: Rental) -> None:
        usage = Usage()
        for path in rental.paths:
            measure_tree(path, usage, self.max_files)
        if rental.size_rw:
            try:
                info = self.client.api.inspect_container(rental.container_id, size=True)
                usage.bytes += int(info.get("SizeRw") or 0)
            except NotFound:
                pass
        # What was there when the guard first saw it (an agent restarted) is not "writing".
        rental.grew = usage.bytes - rental.used if rental.measured else 0
        rental.used, rental.files, rental.measured = usage.bytes, usage.files, True

    def _judge(self, rental: Rental, send: Send) -> None:
        if rental.files > self.max_files:
            self._stop(
                rental,
                send,
                "disk_allowance",
                f"stopped: it made more than {self.max_files:,} files on the host's disk "
                "(writable layer, cache and volumes together), the most a rental may",
            )
            return
        if rental.used > rental.allowance:
            self._stop(
                rental,
                send,
                "disk_allowance",
                f"stopped: it wrote {fmt_bytes(rental.used)} to the host's disk (writable "
                f"layer, cache and volumes together), over its allowance of "
                f"{fmt_bytes(rental.allowance)}",
            )
            return
        if not rental.warned and rental.used >= WARN_FRACTION * rental.allowance:
            rental.warned = True
            send(
                rental.lease_id,
                "",
                f"disk nearly full: {fmt_bytes(rental.used)} of its "
                f"{fmt_bytes(rental.allowance)} allowance used (writable layer, cache and "
                "volumes together); past the allowance the rental is stopped",
            )

    def _stop_biggest_writer(self, send: Send, free: int) -> None:
        writers = [r for r in self.rentals.values() if r.grew >= WRITER_BYTES]
        if not writers:
            log.warning(
                "the disk at %s has %s free, below the floor of %s plus the guard band; "
                "no rental is writing: new rentals are refused until space is freed",
                self.root,
                fmt_bytes(free),
                fmt_bytes(self.floor_bytes),
            )
            return
        biggest = max(writers, key=lambda r: r.grew)
        self._stop(
            biggest,
            send,
            "disk_floor",
            f"stopped: the host's disk was nearly full ({fmt_bytes(free)} free) and this "
            f"rental was writing the most ({fmt_bytes(biggest.grew)} in the last "
            f"{self.interval_s:.0f} s or less)",
        )

    def _stop(self, rental: Rental, send: Send, cause: str, sentence: str) -> None:
        log.warning("lease %s %s", rental.lease_id, sentence)
        try:
            self.stop_container(rental.container_id)
        except (DockerException, requests.RequestException) as exc:
            log.error("could not stop lease %s over its disk: %s", rental.lease_id, exc)
            return
        self.rentals.pop(rental.container_id, None)
        send(rental.lease_id, cause, sentence)


def _rental(
    container_id: str, lease_id: str, labels: dict[str, str], attrs: dict[str, Any]
) -> Rental:
    driver = attrs.get("GraphDriver") or {}
    upper = (driver.get("Data") or {}).get("UpperDir")
    paths = [upper] if upper else []
    for mount in attrs.get("Mounts") or []:
        if mount.get("Type") == "volume" and mount.get("Source"):
            paths.append(mount["Source"])
    try:
        allowance = int(labels.get(LABEL_ALLOWANCE) or DEFAULT_ALLOWANCE_BYTES)
    except ValueError:
        allowance = DEFAULT_ALLOWANCE_BYTES
    return Rental(lease_id, container_id, max(1, allowance), paths, size_rw=not upper)
