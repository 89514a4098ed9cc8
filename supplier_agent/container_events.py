"""Exits of claimed containers, from Docker's event stream.

A container that dies on its own is reported once; one the agent stops itself (a release, a
failed start) is not. Those are tracked by CONTAINER id, not lease id: a lease's next container
(a retried docker_run) must still be reported when it exits.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import requests
from docker import DockerClient
from docker.errors import DockerException

from supplier_agent.compat_docker import close_response

log = logging.getLogger(__name__)

ExitCallback = Callable[[str, int], None]  # (lease_id, exit_code)
# Self-stopped containers whose die/destroy the watcher has not seen yet (it may not be running).
MAX_IGNORED = 1024


class ExitWatcher:
    def __init__(self, client: DockerClient, *, claim_label: str, lease_label: str) -> None:
        self.client = client
        self.claim_label = claim_label
        self.lease_label = lease_label
        # An insertion-ordered set: the oldest entries go first when it is full.
        self._ignored: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def ignore(self, container_id: str) -> None:
        """Don't report this container's next death: the agent is stopping it."""
        with self._lock:
            self._ignored[container_id] = None
            self._ignored.move_to_end(container_id)
            while len(self._ignored) > MAX_IGNORED:
                self._ignored.popitem(last=False)

    def watch(
        self, callback: ExitCallback, stop_event: threading.Event, *, since: float | None = None
    ) -> None:
        """Call ``callback(lease_id, exit_code)`` for each claimed container that dies on its own.

        Blocks until ``stop_event`` is set. ``since`` (Unix time, default now) closes the gap
        between deciding to watch and subscribing: Docker replays events from its buffer. A
        dropped stream (dockerd restarting) resumes after the last event seen.
        """
        seen_ns = (time.time_ns() if since is None else int(since * 1e9)) - 1
        open_streams: list[Any] = []

        def close_on_stop() -> None:
            # Reading the stream blocks; only shutting its socket down wakes the reader.
            stop_event.wait()
            for stream in list(open_streams):
                with contextlib.suppress(OSError, AttributeError):  # raced with the reader
                    stream.close()

        threading.Thread(target=close_on_stop, name="cloudgpu-events-stop", daemon=True).start()
        while not stop_event.is_set():
            try:
                stream = self.client.events(
                    since=f"{seen_ns // 10**9}.{seen_ns % 10**9:09d}",
                    filters={
                        "type": "container",
                        "event": ["die", "destroy"],
                        "label": self.claim_label,
                    },
                    decode=True,
                )
            except (DockerException, requests.RequestException) as exc:
                log.warning("cannot watch Docker events (%s); retrying", exc)
                stop_event.wait(2)
                continue
            open_streams.append(stream)
            try:
                # Checked after the append: a stop from now on finds the stream and closes it.
                for event in () if stop_event.is_set() else stream:
                    event_ns = int(event.get("timeNano") or 0)
                    if event_ns > seen_ns and not stop_event.is_set():
                        seen_ns = event_ns
                        self._handle(event, callback)
            except (DockerException, requests.RequestException, OSError) as exc:
                log.warning("Docker events stream broke (%s); reconnecting", exc)
            finally:
                open_streams.remove(stream)
                close_stream(stream)
            stop_event.wait(1)  # the engine went away: don't spin while it restarts

    def _handle(self, event: dict[str, Any], callback: ExitCallback) -> None:
        actor = event.get("Actor") or {}
        container_id = actor.get("ID") or event.get("id") or ""
        action = event.get("Action") or event.get("status")
        with self._lock:
            # Its death was ours; once seen (or once the container is gone) forget it.
            ignored = self._ignored.pop(container_id, False) is None
        if action != "die" or ignored:
            return
        attributes = actor.get("Attributes") or {}
        lease_id = attributes.get(self.lease_label)
        if not lease_id:
            return
        try:
            exit_code = int(attributes.get("exitCode", -1))
        except ValueError:
            exit_code = -1
        try:
            callback(lease_id, exit_code)
        except Exception:
            log.exception("exit callback failed for lease %s", lease_id)


def close_stream(stream: Any) -> None:
    with contextlib.suppress(OSError):
        stream.close()
    # CancellableStream.close() leaves the response open, and its file object keeps the fd.
    close_response(stream)
