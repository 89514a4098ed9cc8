"""Typed readers for environment settings.

Every setting of the hub comes from the environment; secrets may also come from a file named
by ``<NAME>_FILE`` (Docker and systemd secrets), so they need not sit in the environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvError(ValueError):
    """A setting in the environment has a value we cannot use."""


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvError(f"{name} must be one of 1/0/true/false/yes/no/on/off, not {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvError(f"{name} must be an integer, not {raw!r}") from None


def env_list(name: str, default: list[str] | None = None) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default or [])
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_secret(name: str, default: str = "") -> str:
    """Read ``NAME`` or, failing that, the first line of the file named by ``NAME_FILE``."""
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(f"{name}_FILE")
    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise EnvError(f"{name}_FILE={path} cannot be read: {exc.strerror}") from None
    return default


def database_from_url(url: str) -> dict[str, object]:
    """Turn ``postgres://user:password@host:port/name?sslmode=...`` into a DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql", "pgsql"}:
        raise EnvError(
            f"DATABASE_URL must be a postgres:// URL (CloudGPU runs on PostgreSQL only), "
            f"not {parts.scheme or 'a URL without scheme'}://"
        )
    name = unquote(parts.path.lstrip("/"))
    if not name:
        raise EnvError("DATABASE_URL names no database (postgres://user@host:port/NAME)")
    options: dict[str, str] = {}
    if parts.query:
        for pair in parts.query.split("&"):
            key, _, value = pair.partition("=")
            options[unquote(key)] = unquote(value)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": name,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": unquote(parts.hostname or ""),
        "PORT": str(parts.port or ""),
        "OPTIONS": options,
    }
