"""The NVIDIA container toolkit's version, and whether GPU rentals may run with it.

Toolkits before 1.17.8 let an image's own environment load code into the hook that runs as root
on the host (CVE-2025-23266, "NVIDIAScape"): any renter's image could escape. Such a host takes
no GPU rentals unless its supplier accepts that risk with a flag that says so.
"""

from __future__ import annotations

import re
import shutil
import subprocess

SAFE_TOOLKIT = (1, 17, 8)
RISK_FLAG = "--accept-container-escape-risk"


def toolkit_version() -> tuple[int, ...] | None:
    """From ``nvidia-ctk --version`` (or ``nvidia-container-cli``); None where neither runs."""
    for tool in ("nvidia-ctk", "nvidia-container-cli"):
        path = shutil.which(tool)
        if path is None:
            continue
        try:
            out = subprocess.run(
                [path, "--version"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        match = re.search(r"(\d+)\.(\d+)\.(\d+)", out)
        if match:
            return tuple(int(part) for part in match.groups())
    return None


def toolkit_refusal(version: tuple[int, ...] | None, *, risk_accepted: bool) -> str | None:
    """Why GPU rentals may not start with this toolkit, or None. An unknown version is left to
    Docker, which cannot attach GPUs without a toolkit and says so."""
    if version is None or version >= SAFE_TOOLKIT or risk_accepted:
        return None
    text = ".".join(map(str, version))
    return (
        f"the NVIDIA container toolkit here is {text}, older than 1.17.8: a renter's image could "
        "escape to the host (CVE-2025-23266). Upgrade nvidia-container-toolkit; to rent out GPUs "
        f"anyway, configure the agent with {RISK_FLAG}"
    )
