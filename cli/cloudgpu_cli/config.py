"""Where the hub URL and token live: $XDG_CONFIG_HOME/cloudgpu/config.json (0600, folder 0700),
with CLOUDGPU_HUB / CLOUDGPU_TOKEN overriding it for scripts."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from cloudgpu_cli.errors import AUTH, USAGE, CliError
from cloudgpu_cli.files import write_private

DEFAULT_HUB = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Settings:
    hub: str
    token: str | None
    timeout_s: float = DEFAULT_TIMEOUT_S


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "cloudgpu"


def config_path() -> Path:
    return config_dir() / "config.json"


def read_file() -> dict[str, str]:
    path = config_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc.__class__.__name__}", USAGE) from None
    return {k: v for k, v in data.items() if isinstance(v, str)} if isinstance(data, dict) else {}


def write_file(data: dict[str, str]) -> Path:
    folder = config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    write_private(config_path(), json.dumps(data, indent=2) + "\n")
    return config_path()


def resolve(hub_override: str | None = None) -> Settings:
    stored = read_file()
    hub = hub_override or os.environ.get("CLOUDGPU_HUB") or stored.get("hub") or DEFAULT_HUB
    token = os.environ.get("CLOUDGPU_TOKEN") or stored.get("token")
    return Settings(hub=hub.rstrip("/"), token=token or None, timeout_s=_timeout_s())


def _timeout_s() -> float:
    """CLOUDGPU_TIMEOUT: seconds to wait for the hub's answer (30), for slow links or scripts
    that would rather fail fast."""
    raw = os.environ.get("CLOUDGPU_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:
        raise CliError(f"CLOUDGPU_TIMEOUT must be seconds from 0 to 3600, not {raw!r}", USAGE)
    return value


def require_token(settings: Settings) -> str:
    if not settings.token:
        raise CliError("not logged in: run `cloudgpu login` (or set CLOUDGPU_TOKEN)", AUTH)
    return settings.token
