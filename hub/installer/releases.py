"""The agent release the hub serves at /agent/release.json: a folder signed away from the hub
(AGENT_RELEASE_DIR), or the wheel the hub builds from its own tree, signed with
AGENT_RELEASE_SIGNING_KEY_FILE when one is set, unsigned otherwise."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings

from hub.installer.services import AgentWheelError, agent_version, build_agent_wheel
from supplier_agent import release_signing

MAX_RELEASE_BYTES = 64 * 1024


class ReleaseError(RuntimeError):
    """No release can be served; the message says why (logged, never shown to callers)."""


@dataclass(frozen=True)
class Release:
    description: dict[str, Any]  # release.json without its url
    wheel: Path


def current() -> Release:
    if settings.AGENT_RELEASE_DIR:
        return _from_folder(Path(settings.AGENT_RELEASE_DIR))
    try:
        wheel = build_agent_wheel(settings.AGENT_DIST_DIR)
    except AgentWheelError as exc:
        raise ReleaseError(str(exc)) from exc
    description: dict[str, Any] = {
        "version": wheel.version,
        "filename": wheel.filename,
        "sha256": wheel.sha256,
    }
    if settings.AGENT_RELEASE_SIGNING_KEY_FILE:
        key = _signing_key(settings.AGENT_RELEASE_SIGNING_KEY_FILE)
        signature = release_signing.sign(key, wheel.version, wheel.filename, wheel.sha256, [])
        description |= {"next_keys": [], "signatures": [signature]}
    return Release(description, wheel.path)


def served_version() -> str:
    """The version ``current()`` serves, without building a wheel: a rollout's target."""
    if settings.AGENT_RELEASE_DIR:
        return str(_from_folder(Path(settings.AGENT_RELEASE_DIR)).description["version"])
    try:
        return agent_version()
    except AgentWheelError as exc:
        raise ReleaseError(str(exc)) from exc


@lru_cache(maxsize=4)
def _signing_key(path: str) -> Any:
    try:
        return release_signing.load_private_key(Path(path))
    except (OSError, ValueError) as exc:
        raise ReleaseError(f"AGENT_RELEASE_SIGNING_KEY_FILE {path}: {exc}") from None


def _from_folder(folder: Path) -> Release:
    """The signed folder as its operator made it; checked enough that a broken one is a 503
    and a line in the log, not a release agents refuse one by one."""
    try:
        text = (folder / release_signing.RELEASE_FILE).read_bytes()[:MAX_RELEASE_BYTES]
        data = json.loads(text)
        filename = data["filename"]
        wheel = folder / filename
        if Path(filename).name != filename or not wheel.is_file():
            raise ReleaseError(f"{folder}: {filename!r} is not a wheel in the folder")
        keep = ("version", "filename", "sha256", "next_keys", "signatures")
        return Release({k: data[k] for k in keep if k in data}, wheel)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(f"AGENT_RELEASE_DIR {folder}: {exc}") from None


def pinned_keys() -> tuple[str, ...]:
    """The keys install commands pin: AGENT_RELEASE_PUBLIC_KEYS, else the signing key's."""
    if settings.AGENT_RELEASE_PUBLIC_KEYS:
        return release_signing.parse_keys(settings.AGENT_RELEASE_PUBLIC_KEYS)
    if settings.AGENT_RELEASE_SIGNING_KEY_FILE and not settings.AGENT_RELEASE_DIR:
        key = _signing_key(settings.AGENT_RELEASE_SIGNING_KEY_FILE)
        return (release_signing.public_key_text(key.public_key()),)
    return ()
