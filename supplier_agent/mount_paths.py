"""Where in a rental's container a volume may be mounted: one rule for the hub and the agent.

A renter chooses the mount path of each of their volumes, and an admin a template's cache path.
Left open, ``/proc`` made runc fail with an error full of the host's paths, ``/etc`` or ``/dev``
hid what Docker and the NVIDIA hook put there (resolv.conf, the GPU's device nodes), and
``"/data\\n--privileged"`` reached Docker as a path. The hub refuses such a path when it is
chosen, with the same sentence the agent would give, and the agent refuses it again whatever
an older or compromised hub sends.
"""

from __future__ import annotations

import posixpath
import unicodedata

MAX_MOUNT_PATH_BYTES = 1024
# Folders that belong to the kernel, the image's system or the container engine: a volume over
# them breaks the container (or the GPU hook) or lets a renter's files stand in for the system.
SYSTEM_FOLDERS = (
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/usr",
    "/boot",
    "/run",
    "/var/run",
    "/var/lock",
    "/var/lib/docker",
    "/var/lib/containerd",
)
MOUNT_PATH_RULE = (
    "a mount path must be an absolute folder in normal form outside the system folders "
    "(/proc, /sys, /dev, /etc, /usr, ...), e.g. /data"
)
# Unicode categories that print as nothing or break lines: controls (\n, \r, \t, DEL),
# formats (bidi overrides, zero-width), and the line and paragraph separators.
_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp"})


def mount_path_refusal(path: object) -> str | None:
    """Why ``path`` may not be a mount path in a rental's container, or None if it may.

    The answer reads after the path's name, e.g. ``f"volumes[0].path {refusal}"``: what is
    wrong, then the rule with an example.
    """
    problem = _problem(path)
    return None if problem is None else f"{problem}; {MOUNT_PATH_RULE}"


def _problem(path: object) -> str | None:
    if not isinstance(path, str):
        return "is not a string"
    if not path:
        return "is empty"
    if len(path) > MAX_MOUNT_PATH_BYTES:  # never fewer bytes than characters
        return f"is longer than {MAX_MOUNT_PATH_BYTES} bytes"
    categories = {unicodedata.category(char) for char in path}
    # JSON's "\ud800" decodes to a lone surrogate: no UTF-8 for Docker, nor for Postgres.
    if "Cs" in categories:
        return "is not valid UTF-8 (a lone surrogate)"
    if categories & _INVISIBLE:
        return "contains a control character"
    if len(path.encode()) > MAX_MOUNT_PATH_BYTES:
        return f"is longer than {MAX_MOUNT_PATH_BYTES} bytes"
    if not path.startswith("/"):
        return "is not absolute"
    if path == "/":
        return "is the container's root folder"
    # normpath keeps a leading "//" (POSIX leaves its meaning to the system): checked apart.
    if "//" in path or posixpath.normpath(path) != path:
        return "is not in normal form (no trailing /, no //, no . or .. parts)"
    for folder in SYSTEM_FOLDERS:
        if path == folder:
            return f"is {folder}, a system folder"
        if path.startswith(folder + "/"):
            return f"is inside {folder}, a system folder"
    return None
