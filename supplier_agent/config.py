"""Agent settings: command-line flag, then ``CLOUDGPU_*`` environment, then the config file
(``<state>/cloudgpu-agent.conf``, or ``CLOUDGPU_CONFIG`` when set; mode 0600, written by
``configure``), then defaults."""

from __future__ import annotations

import configparser
import ipaddress
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

from supplier_agent.egress import parse_allowed
from supplier_agent.limits import DEFAULT_RESERVE, Reserve, parse_reserve

T = TypeVar("T")

CONFIG_NAME = "cloudgpu-agent.conf"
WS_PATH = "/api/p2p/ws/"
RUNTIMES = ("docker", "mock")
COMPUTE_MODES = ("best-effort", "require", "skip")
GPU_DEVICES = ("nvidia", "none")
MAX_TOKEN_LEN = 256


class ConfigError(ValueError):
    """A setting is missing or unusable; the message says which and how to fix it."""


def default_state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/cloudgpu-agent")
    return (
        Path(os.environ.get("XDG_STATE_HOME", Path.home() / ".local" / "state")) / "cloudgpu-agent"
    )


@dataclass(frozen=True)
class AgentConfig:
    hub_url: str
    token: str = field(repr=False)  # never in a repr, a log line or an argv
    state_dir: Path
    runtime: str = "docker"
    compute_mode: str = "best-effort"
    gpu_devices: str = "nvidia"
    lock_dir: Path = Path("/var/lock")
    log_level: str = "INFO"
    # Memory and CPUs rentals never get (limits.py); None: the defaults there.
    reserve: Reserve = DEFAULT_RESERVE
    # Ranges on the supplier's side that rentals may reach after all (egress.py).
    allow_networks: tuple[str, ...] = ()
    # GPU rentals even on an NVIDIA toolkit older than 1.17.8 (toolkit.py): the name says it.
    accept_container_escape_risk: bool = False
    # Renters' cache volumes unused this long are removed, and sooner while Docker's disk has
    # less free than the floor (volumes.py).
    volume_idle_days: float = 14.0
    # Below this much free on Docker's disk (plus a guard band) the agent takes no rentals and
    # stops the biggest writer (disk_guard.py); unused volumes go sooner too.
    disk_floor_gib: float = 20.0
    # A rental's disk allowance when the hub sends none (hubs from before allowances).
    disk_allowance_gib: float = 50.0
    # The most one lease's container output takes on Docker's disk, rotated (containers.py).
    container_log_mib: float = 64.0
    # Rent out images that exist only on this host, unpulled (containers.obtain_image): off,
    # every rental pulls its image anonymously from a public registry.
    allow_local_images: bool = False
    # Housekeeping (volume janitor, volume usage reports): first this long after start, then
    # every housekeeping_every_s. Tests shorten both to see a report without waiting a minute.
    housekeeping_first_s: float = 60.0
    housekeeping_every_s: float = 3600.0
    # The public keys agent releases must be signed with (release_signing.py), pinned at
    # install; none: `upgrade` warns and checks no signature.
    release_keys: tuple[str, ...] = ()

    @property
    def ws_url(self) -> str:
        return websocket_url(self.hub_url)


def websocket_url(hub_url: str) -> str:
    """``https://hub.example.com`` -> ``wss://hub.example.com/api/p2p/ws/``."""
    parts = urlsplit(hub_url.strip())
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.hostname:
        raise ConfigError(f"hub URL must look like https://hub.example.com, not {hub_url!r}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigError(
            "hub URL must not carry credentials or a query; the token goes in the config"
        )
    if parts.path not in {"", "/", WS_PATH, WS_PATH.rstrip("/")}:
        # The original agents put the token in the path; it must not end up in logs from here.
        raise ConfigError("hub URL must be the hub's address only, e.g. https://hub.example.com")
    if scheme == "ws" and not is_loopback(parts.hostname):
        raise ConfigError("the hub must be reached over https:// (plain http only on loopback)")
    return urlunsplit((scheme, parts.netloc, WS_PATH, "", ""))


def is_loopback(hostname: str) -> bool:
    if hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def validate_token(token: str) -> str:
    token = token.strip()
    if not token:
        raise ConfigError("the supplier token is empty")
    if len(token) > MAX_TOKEN_LEN or not token.isascii() or any(c.isspace() for c in token):
        raise ConfigError("the supplier token has an unexpected form; copy it again from the hub")
    return token


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}, not {value!r}")
    return value


def _parsed(parse: Callable[..., T], *texts: str | None) -> T:
    """A setting through its module's parser, its ValueError as this module's ConfigError."""
    try:
        return parse(*texts)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _positive(name: str, text: str | None) -> float:
    try:
        value = float(text or "")
    except ValueError:
        raise ConfigError(f"{name} must be a number, not {text!r}") from None
    if value < 0:
        raise ConfigError(f"{name} cannot be negative")
    return value


def config_path(state_dir: Path, env: dict[str, str] | None = None) -> Path:
    """The config file: ``CLOUDGPU_CONFIG`` when set, else the one in the state folder. The
    installer points it at a staged file to try a new config before renaming it into place."""
    env = dict(os.environ) if env is None else env
    return Path(env["CLOUDGPU_CONFIG"]) if env.get("CLOUDGPU_CONFIG") else state_dir / CONFIG_NAME


def _parse(path: Path) -> configparser.ConfigParser | None:
    """The whole file, every section; None if there is none."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path) as handle:
            parser.read_file(handle)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except configparser.Error as exc:
        # configparser quotes the offending line, which may be the token line.
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ConfigError(f"{path} is not a valid config file{where}") from None
    return parser


def read_file(state_dir: Path, path: Path | None = None) -> dict[str, str]:
    """The ``[agent]`` settings of ``path`` (default: the state folder's config); {} if none."""
    parser = _parse(path or state_dir / CONFIG_NAME)
    return dict(parser["agent"]) if parser is not None and parser.has_section("agent") else {}


def write_file(
    state_dir: Path,
    values: dict[str, str],
    *,
    path: Path | None = None,
    base: Path | None = None,
) -> Path:
    """Write the config atomically with mode 0600 (it holds the token) to ``path`` (default:
    the state folder's config). With ``base``, ``values`` go over that file's: its other keys
    and sections stay, unknown ones included (a newer or older agent's settings)."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = path or state_dir / CONFIG_NAME
    parser = (_parse(base) if base is not None else None) or configparser.ConfigParser(
        interpolation=None
    )
    if not parser.has_section("agent"):
        parser.add_section("agent")
    for key, value in values.items():
        parser["agent"][key] = value
    # Beside the target, so the rename is atomic; named after it, so two targets never share.
    tmp = path.with_name(f".{path.name}.tmp")
    # A new file, never one that is there already (a crashed run's is removed first): with
    # O_EXCL a link someone placed there is refused, not followed to write the token elsewhere.
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            parser.write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        # A full disk: no half-written file left behind.
        tmp.unlink(missing_ok=True)
        raise
    return path


def parse_release_keys(text: str | None) -> tuple[str, ...]:
    """``ed25519:...,ed25519:...`` checked and normalised; ConfigError names a bad one."""
    if not text:
        return ()
    from supplier_agent import release_signing  # cryptography: only where keys are pinned

    try:
        return release_signing.parse_keys(text.split(","))
    except release_signing.SignatureError as exc:
        raise ConfigError(f"release_keys: {exc}") from None


def load(flags: dict[str, str | None], env: dict[str, str] | None = None) -> AgentConfig:
    """Merge flag > CLOUDGPU_* env > config file > default into one checked config."""
    env = dict(os.environ) if env is None else env
    state_dir = Path(flags.get("state") or env.get("CLOUDGPU_STATE_DIR") or default_state_dir())
    path = config_path(state_dir, env)
    file_values = read_file(state_dir, path)

    def pick(key: str, default: str | None = None) -> str | None:
        return (
            flags.get(key) or env.get(f"CLOUDGPU_{key.upper()}") or file_values.get(key) or default
        )

    hub = pick("hub")
    if not hub:
        raise ConfigError(
            f"no hub URL: run `cloudgpu-agent configure --state {state_dir} --hub URL` first "
            "(or set CLOUDGPU_HUB)"
        )
    token = pick("token")
    if not token:
        raise ConfigError(
            f"no supplier token in {path}; run `cloudgpu-agent configure` "
            "with the token on stdin (or set CLOUDGPU_TOKEN)"
        )
    config = AgentConfig(
        hub_url=hub,
        token=validate_token(token),
        state_dir=state_dir,
        runtime=_choice("runtime", pick("runtime", "docker") or "docker", RUNTIMES),
        compute_mode=_choice(
            "compute-mode", pick("compute_mode", "best-effort") or "best-effort", COMPUTE_MODES
        ),
        gpu_devices=_choice("gpu-devices", pick("gpu_devices", "nvidia") or "nvidia", GPU_DEVICES),
        lock_dir=Path(pick("lock_dir", "/var/lock") or "/var/lock"),
        log_level=(pick("log_level", "INFO") or "INFO").upper(),
        reserve=_parsed(parse_reserve, pick("reserve_memory_mib"), pick("reserve_cpus")),
        allow_networks=_parsed(parse_allowed, pick("allow_networks")),
        accept_container_escape_risk=(pick("accept_container_escape_risk") or "").lower()
        in {"1", "true", "yes"},
        volume_idle_days=_positive("volume_idle_days", pick("volume_idle_days", "14")),
        disk_floor_gib=_positive("disk_floor_gib", pick("disk_floor_gib", "20")),
        disk_allowance_gib=_positive("disk_allowance_gib", pick("disk_allowance_gib", "50")),
        container_log_mib=_positive("container_log_mib", pick("container_log_mib", "64")),
        allow_local_images=(pick("allow_local_images") or "").lower() in {"1", "true", "yes"},
        housekeeping_first_s=_positive("housekeeping_first_s", pick("housekeeping_first_s", "60")),
        housekeeping_every_s=max(
            1.0, _positive("housekeeping_every_s", pick("housekeeping_every_s", "3600"))
        ),
        release_keys=parse_release_keys(pick("release_keys")),
    )
    websocket_url(config.hub_url)  # fail now, not at the first connection
    return config
