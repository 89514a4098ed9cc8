"""What rentals write on the supplier's disk, measured and bounded (issue 33 item 1).

Every rental has a disk allowance (the hub sends the sum of its GPUs', set by the supplier):
its container's writable layer, its cache volume and its own volumes together, and the files
it deleted but keeps open. Docker bounds none of these by default, and a renter's ``dd``
writes ~400 MiB/s: a host fills in minutes.

Where Docker's storage driver takes a size limit (overlay2 on xfs mounted with ``pquota``),
containers.py sets ``--storage-opt size=`` for the writable layer as well. Everywhere, this
guard measures each rental (disk_usage.py) every ``interval_s``, and sooner when, at a tick
(``tick_s``), the host's free space has fallen, or a rental's processes have written (their
kernel counters: the free space alone misses a writer while something else frees space), by
more than the rental's headroom since the last pass. A full-speed writer is so caught about a
tick and a pass after it crosses its allowance: MARGIN_BYTES, which docs/suppliers.md promises,
holds
while a pass takes well under a second (0.22 s for 8 rentals of 10,000 files each,
docs/benchmarks.md); a pass
over rentals with hundreds of thousands of files takes seconds, and the overshoot grows with
it. At WARN_FRACTION of its allowance the renter is told; past it, the container is killed and
the lease ends with the reason on its page.

Host-wide: while the free space is below the supplier's floor plus the guard band, the agent
takes no new rentals, and the rental that grew the most over the last window (``interval_s``)
is stopped, so a writer does not take the host below the floor.

Not bounded here: image pulls (a renter's choice of a huge image), which the agent checks only
against the floor before it starts a rental.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from docker.errors import NotFound

from supplier_agent.disk_usage import (
    Usage,
    add_deleted_open_files,
    measure_tree,
    pid_namespace,
    processes_by_pid_namespace,
    written_bytes,
)

log = logging.getLogger("cloudgpu.agent.disk")

GIB = 1024**3
MIB = 1024**2
LABEL_ALLOWANCE = "cloudgpu.disk.allowance"
DEFAULT_ALLOWANCE_BYTES = 50 * GIB
WARN_FRACTION = 0.9
# The rental's files measured at most this often, and the host's free space this often.
INTERVAL_S = 10.0
TICK_S = 0.25
# A pass comes early when the host's free space fell by this much (or by the smallest
# headroom, when less, but never under MIN_TRIGGER_BYTES: a rental at its allowance's edge
# must not turn the host's ordinary disk noise into a pass a second) since the last one.
TRIGGER_BYTES = 256 * MIB
MIN_TRIGGER_BYTES = 32 * MIB
# What a full-speed writer may overshoot by (docs/suppliers.md): the trigger, plus a tick and a
# pass of writing at ~400 MiB/s.
MARGIN_BYTES = 1 * GIB
# Above the supplier's floor: the free space at which the biggest writer is stopped, so that
# it does not reach the floor itself.
GUARD_BAND_BYTES = 1 * GIB
# Below the floor, a rental that grew by this much over the window is a writer to stop.
WRITER_BYTES = 1 * MIB
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
    pid: int = 0  # its init's pid on the host: its processes share that PID namespace
    size_rw: bool = False  # no folder for its layer: Docker's own SizeRw (slower) counts it
    used: int = 0
    files: int = 0
    # Growth is what it holds now less what it held at the start of the window (INTERVAL_S),
    # so that early passes a second apart do not hide a steady writer. A container the guard
    # saw start grows from nothing; one already running when the agent started, from what it
    # held at the first pass.
    fresh: bool = False
    baseline: int | None = None
    window_started: float = 0.0
    grew: int = 0
    written_at_pass: int = 0  # its processes' write counters at the last pass
    warned: bool = False
    unreadable_logged: bool = False


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
        default_allowance: int = DEFAULT_ALLOWANCE_BYTES,
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
        # For containers made before allowances (no label): the agent's configured one.
        self.default_allowance = default_allowance
        self.interval_s = interval_s
        self.tick_s = tick_s
        self.max_files = max_files
        self.rentals: dict[str, Rental] = {}
        # The agent's own PID namespace, read once: a rental's is compared with it each tick.
        self._own_namespace = pid_namespace(os.getpid())
        # Below floor + band the runtime takes no rental (refusal) and the biggest writer goes.
        self.low_disk = False
        self.last_pass_s = 0.0  # what the last pass cost, for the log and the benchmark
        self._free_at_pass: int | None = None
        self._passes = 0
        self._lock = threading.Lock()

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.root).free

    def refusal(self) -> str | None:
        """Why a new rental may not start now, or None."""
        try:
            free = self.free_bytes()
        except OSError:
            return None
        self.low_disk = free < self.floor_bytes + GUARD_BAND_BYTES
        if self.low_disk:
            return (
                f"this host's disk has {fmt_bytes(free)} free, at its supplier's floor of "
                f"{fmt_bytes(self.floor_bytes)}: it takes no new rentals until space is freed"
            )
        return None

    # --- the loop ---------------------------------------------------------------------------

    def watch(self, send: Send, stop: threading.Event) -> None:
        next_pass = 0.0
        while not stop.is_set():
            free: int | None
            try:
                free = self.free_bytes()
            except OSError as exc:
                # The allowances are still checked; only the floor needs the free space.
                log.error("cannot read the free disk space at %s: %s", self.root, exc)
                free = None
            due = time.monotonic() >= next_pass
            try:
                writing = not due and self._writing()
            except Exception:
                log.exception("reading the rentals' write counters failed")
                writing = False
            if due or writing or (free is not None and self._falling(free)):
                try:
                    self.check(send, free)
                except Exception:
                    # Whatever it was, the guard goes on: a dead guard bounds nothing.
                    log.exception("measuring the rentals' disk use failed; trying again")
                next_pass = time.monotonic() + self.interval_s
            stop.wait(self.tick_s)

    def _falling(self, free: int) -> bool:
        if self._free_at_pass is None:
            return True
        headroom = min(
            (max(0, r.allowance - r.used) for r in self.rentals.values()),
            default=TRIGGER_BYTES,
        )
        trigger = max(MIN_TRIGGER_BYTES, min(TRIGGER_BYTES, headroom))
        if free < self.floor_bytes + GUARD_BAND_BYTES + TRIGGER_BYTES:
            trigger = MIN_TRIGGER_BYTES  # near the floor: watch closely
        return self._free_at_pass - free >= trigger

    def _writing(self) -> bool:
        """Whether a rental's processes wrote more than its trigger since the last pass, by
        their own counters (``/proc/<pid>/io``, counted as pages are dirtied): the host's free
        space alone misses a writer while something else frees space meanwhile."""
        with self._lock:
            # Each tick (one listing call): a rental that just started is followed at once,
            # not at the next pass, so a writer from its first second is seen.
            self._follow()
        if not self.rentals:
            return False
        namespaces = processes_by_pid_namespace()
        for rental in self.rentals.values():
            written = self._written(rental, namespaces)
            trigger = max(MIN_TRIGGER_BYTES, min(TRIGGER_BYTES, rental.allowance - rental.used))
            if written - rental.written_at_pass >= trigger:
                return True
        return False

    def _written(self, rental: Rental, namespaces: dict[str, list[int]]) -> int:
        namespace = self._namespace(rental)
        return written_bytes(namespaces.get(namespace, [])) if namespace is not None else 0

    def _namespace(self, rental: Rental) -> str | None:
        namespace = pid_namespace(rental.pid) if rental.pid else None
        # Never the host's own namespace (a container sharing it would be charged for every
        # process of the host); rentals always have their own.
        if namespace is None or namespace == self._own_namespace:
            return None
        return namespace

    def check(self, send: Send, free: int | None = None) -> None:
        """One pass: measure every rental, warn, stop what is over; then the host's floor."""
        with self._lock:
            started = time.monotonic()
            self._follow()
            namespaces = processes_by_pid_namespace()
            devices = self._devices()
            for rental in list(self.rentals.values()):
                self._measure(rental, namespaces, devices)
                # A process that exits takes its count along: the sum can fall, never matters.
                rental.written_at_pass = self._written(rental, namespaces)
                self._judge(rental, send)
            self.last_pass_s = time.monotonic() - started
            self._passes += 1
            if free is None:
                try:
                    free = self.free_bytes()
                except OSError:
                    return
            self._free_at_pass = free
            self.low_disk = free < self.floor_bytes + GUARD_BAND_BYTES
            if self.low_disk:
                self._stop_biggest_writer(send, free)

    def _devices(self) -> set[int]:
        try:
            return {os.stat(self.root).st_dev}
        except OSError:
            return set()

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
            rental = _rental(
                container_id,
                labels.get(self.lease_label, ""),
                labels,
                attrs,
                self.default_allowance,
            )
            rental.window_started = time.monotonic()
            rental.fresh = self._passes > 0
            self.rentals[container_id] = rental

    def _measure(self, rental: Rental, namespaces: dict[str, list[int]], devices: set[int]) -> None:
        usage = Usage()
        for path in rental.paths:
            if not measure_tree(path, usage, self.max_files) and not rental.unreadable_logged:
                rental.unreadable_logged = True
                log.error(
                    "cannot read %s of lease %s: its disk use there is not bounded (does the "
                    "agent run as root on Docker's own host?)",
                    path,
                    rental.lease_id,
                )
        if rental.size_rw:
            try:
                info = self.client.api.inspect_container(rental.container_id, size=True)
                usage.bytes += int(info.get("SizeRw") or 0)
            except NotFound:
                pass
        namespace = self._namespace(rental)
        if namespace is not None:
            with_root = set(devices)
            with contextlib.suppress(OSError):  # its overlay root: a device of its own
                with_root.add(os.stat(f"/proc/{rental.pid}/root").st_dev)
            add_deleted_open_files(namespaces.get(namespace, []), with_root, usage)
        rental.used, rental.files = usage.bytes, usage.files
        if rental.baseline is None:
            rental.baseline = 0 if rental.fresh else usage.bytes
        rental.grew = usage.bytes - rental.baseline
        now = time.monotonic()
        if now - rental.window_started >= self.interval_s:
            rental.baseline, rental.window_started = usage.bytes, now

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
                f"stopped: it held {fmt_bytes(rental.used)} on the host's disk (writable "
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
        except Exception as exc:  # a ContainerError, a dead engine: try again next pass
            log.error("could not stop lease %s over its disk: %s", rental.lease_id, exc)
            return
        self.rentals.pop(rental.container_id, None)
        send(rental.lease_id, cause, sentence)


def _rental(
    container_id: str,
    lease_id: str,
    labels: dict[str, str],
    attrs: dict[str, Any],
    default_allowance: int,
) -> Rental:
    driver = attrs.get("GraphDriver") or {}
    upper = (driver.get("Data") or {}).get("UpperDir")
    paths = [upper] if upper else []
    for mount in attrs.get("Mounts") or []:
        if mount.get("Type") == "volume" and mount.get("Source"):
            paths.append(mount["Source"])
    try:
        allowance = int(labels.get(LABEL_ALLOWANCE) or default_allowance)
    except ValueError:
        allowance = default_allowance
    pid = int((attrs.get("State") or {}).get("Pid") or 0)
    return Rental(lease_id, container_id, max(1, allowance), paths, pid, size_rw=not upper)


def volumes_refusal(paths: list[str], allowance: int) -> str | None:
    """Why a rental may not start with these volumes (the cache and the renter's, kept from
    earlier leases): they already hold more than its allowance, so it would be stopped at once
    for what it never wrote."""
    usage = Usage()
    for path in paths:
        measure_tree(path, usage, MAX_FILES)
    if usage.bytes <= allowance:
        return None
    return (
        f"the volumes of this rental already hold {fmt_bytes(usage.bytes)} on this host, over "
        f"its disk allowance of {fmt_bytes(allowance)}: delete files from them, or rent more "
        "GPUs (each brings its allowance)"
    )
