"""Where the hub URL and token live: $XDG_CONFIG_HOME/cloudgpu/config.json (0600, folder 0700),
with CLOUDGPU_HUB / CLOUDGPU_TOKEN overriding it for scripts."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cloudgpu_cli.errors import AUTH, USAGE, CliError

DEFAULT_HUB = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Settings:
    hub: str
    token: str | None


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
    """Atomically: a temp file made 0600 from the start in the same folder, then renamed, so
    neither a crash nor another reader ever sees a half-written or world-readable token."""
    folder = config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".config.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, config_path())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return config_path()


def resolve(hub_override: str | None = None) -> Settings:
    stored = read_file()
    hub = hub_override or os.environ.get("CLOUDGPU_HUB") or stored.get("hub") or DEFAULT_HUB
    token = os.environ.get("CLOUDGPU_TOKEN") or stored.get("token")
    return Settings(hub=hub.rstrip("/"), token=token or None)


def require_token(settings: Settings) -> str:
    if not settings.token:
        raise CliError("not logged in: run `cloudgpu login` (or set CLOUDGPU_TOKEN)", AUTH)
    return settings.token
