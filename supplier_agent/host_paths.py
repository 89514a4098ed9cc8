"""The supplier's filesystem left out of what a renter reads about a failed rental.

Docker, containerd and runc explain a failed start with the host's own paths: the volume's
folder under ``/var/lib/docker``, the overlay's layer list, the shim's socket under
``/run/containerd``, runc's ``/proc/self/fd/7``, the container's cgroup. Passed on as a
lease's failure reason they told a renter how the supplier's host is laid out (and which other
layers and containers it holds). ``redact_host_paths`` replaces each such path with
``<host path>`` and keeps the rest of the sentence; the container-side paths the renter named
(``to rootfs at "/data"``, ``exec: "/start.sh"``) stay, since they are what went wrong.

The agent redacts the error of every failed command it answers (the full text stays in its
log); the hub redacts again what it stores, for agents from before this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

PLACEHOLDER = "<host path>"
# Trees that are the engine's or the host's, never a folder a renter chose (the mount rule keeps
# volumes out of them): everything under them is the host's.
HOST_FOLDERS = (
    "/var/lib/docker",
    "/var/lib/containerd",
    "/var/lib/cloudgpu-agent",
    "/var/lib/nvidia-container-toolkit",
    "/run",
    "/var/run",
    "/sys/fs/cgroup",
    # Matched in messages, never written to: the host's scratch files in an engine's error.
    "/tmp",  # noqa: S108
    "/var/tmp",  # noqa: S108
)
# A process's own /proc entry (runc reopens mount sources as /proc/self/fd/N); /proc itself, or
# /proc/driver/nvidia, says nothing about the host.
_PROC_OF_PROCESS = re.compile(r"^/proc/(?:\d+|self|thread-self)(?:/|$)")
# A container or layer id (64 hex digits, also in "docker-<id>.scope" or "<id>-init"): in any
# path-like word, also the tail of one cut short by an older agent's truncation.
_ENGINE_ID = re.compile(r"[0-9a-f]{64}")
# Folders of the engine and the agent wherever their root is (Docker's data root moved to
# another disk, the agent's state under a supplier's home folder).
_ENGINE_FOLDER = re.compile(r"/(?:overlay2|_data|cloudgpu-agent|io\.containerd\.[^/]*)(?:/|$)")
# What ends a path in Docker's messages: quotes (also escaped ones), brackets, the ":" of
# "src:dst" and of overlay lists, the "," of mount options, "=".
_PATH_CHAR = r"[^\s\"'`\\:,;()\[\]{}<>|=]"
# Maximal runs only (a slash checked after): a long word without one costs linear time.
_WORD = re.compile(rf"{_PATH_CHAR}+")
# Overlay mount options name every layer of the image: the whole list goes.
_OVERLAY_OPTION = re.compile(r"\b(lowerdir|upperdir|workdir)=[^\s,\"'\\]+")
# Where runc names a path inside the container: the renter's own, which stays.
_CONTAINER_SIDE = re.compile(r"(?:rootfs at|exec:) \\*\"(/[^\"\\]*)\\*\"")


def redact_host_paths(
    text: str, *, host_folders: Iterable[str] = (), keep: Iterable[str] = ()
) -> str:
    """``text`` with every host path replaced by ``<host path>``.

    ``host_folders``: more trees that are the host's (the agent's state folder, Docker's data
    root where it is not the usual one), absolute; matched as written, spaces included. ``keep``:
    container-side paths the renter named, which stay wherever they appear unless they carry an
    engine id.
    """
    # Absolute ones only: a relative "state" would take the word out of every sentence.
    extra = [f.rstrip("/") for f in host_folders if f.startswith("/") and f.strip("/")]
    folders = (*HOST_FOLDERS, *extra)
    kept = {*keep, *_CONTAINER_SIDE.findall(text)}
    text = _OVERLAY_OPTION.sub(lambda m: f"{m.group(1)}={PLACEHOLDER}", text)
    for folder in sorted(extra, key=len, reverse=True):
        # Before the words: a supplier's folder may hold a space, which ends a word.
        pattern = rf"{re.escape(folder)}(?:/{_PATH_CHAR}*)?(?!{_PATH_CHAR})"
        text = re.sub(pattern, PLACEHOLDER, text)

    def replace(match: re.Match[str]) -> str:
        word = match.group(0)
        if "/" not in word:
            return word
        if _ENGINE_ID.search(word):
            return PLACEHOLDER
        if word in kept or not word.startswith("/"):
            return word
        if (
            _ENGINE_FOLDER.search(word)
            or _PROC_OF_PROCESS.match(word)
            or any(_within(word, folder) for folder in folders)
        ):
            return PLACEHOLDER
        return word

    return _WORD.sub(replace, text)


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + "/")
