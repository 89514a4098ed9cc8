"""``cloudgpu-agent install-service`` / ``uninstall-service``: the systemd unit that keeps the
agent running on a supplier host.

Layout under the prefix (default ``/opt/cloudgpu-agent``): ``venvs/<version>/`` holds one
virtualenv per installed version and ``venv`` is a symlink to the current one (see
``upgrade.py``); the unit starts ``<prefix>/venv/bin/cloudgpu-agent``, so an upgrade only swaps
the symlink and restarts the service. A plain ``venv`` directory works too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

UNIT_NAME = "cloudgpu-agent.service"
SERVICE = "cloudgpu-agent"
DEFAULT_PREFIX = Path("/opt/cloudgpu-agent")
DEFAULT_UNIT_DIR = Path("/etc/systemd/system")
SYSTEMCTL_TIMEOUT_S = 120
# sd_booted(3): systemd is the running init exactly when this folder exists. A container or a
# WSL or OpenRC host may have systemctl installed and still no systemd to talk to.
SYSTEMD_RUNNING_DIR = Path("/run/systemd/system")

# systemd splits ExecStart on whitespace and expands %, $, quotes and backslashes: paths with any
# of them would need escaping we would rather not get subtly wrong, so they are refused.
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/@+:,=-]*$")

UNIT_TEMPLATE = """\
# Written by `cloudgpu-agent install-service`; rewritten on the next run, edit with care.
[Unit]
Description=CloudGPU supplier agent
After=network-online.target docker.service
Wants=network-online.target docker.service

[Service]
Type=simple
# The supplier token lives in <state>/cloudgpu-agent.conf (mode 0600), never on this line.
ExecStart={agent} run --state {state}
Environment=PYTHONUNBUFFERED=1
Restart=always
RestartSec=5
# root: the agent sets GPU compute modes through NVML and owns /var/lock/cloudgpu-gpu-*.lock,
# the flock files other CloudGPU-compatible platforms on this host also take.
User=root
# Stop only the agent process. Renters' containers belong to dockerd, not to this unit, and
# keep running; the agent re-adopts them (and their claims) when it starts again.
KillMode=process
TimeoutStopSec=30
# Hardening that leaves Docker (a socket), NVML (/dev/nvidia*, no device policy) and the lock
# and state folders (/run/lock, /var/lib) working. No ProtectClock / PrivateDevices /
# ProtectKernelModules: each of those closes /dev/nvidia* or nvidia-modprobe.
NoNewPrivileges=yes
ProtectSystem=full
PrivateTmp=yes
ProtectControlGroups=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
LockPersonality=yes

[Install]
WantedBy=multi-user.target
"""


class ServiceError(RuntimeError):
    """The service cannot be installed or removed; the message says why."""


def _checked_path(label: str, path: Path) -> Path:
    path = path.expanduser().absolute()
    if not _SAFE_PATH.match(str(path)):
        raise ServiceError(
            f"{label} {str(path)!r} contains characters systemd would reinterpret "
            "(spaces, %, $, quotes, backslashes); choose a plainer path"
        )
    return path


def render_unit(prefix: Path, state_dir: Path) -> str:
    agent = _checked_path("prefix", prefix) / "venv" / "bin" / "cloudgpu-agent"
    state = _checked_path("state folder", state_dir)
    return UNIT_TEMPLATE.format(agent=agent, state=state)


def _systemctl(*args: str) -> None:
    print(f"running: systemctl {' '.join(args)}")
    try:
        result = subprocess.run(
            ["systemctl", *args],
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError:
        raise ServiceError(
            "systemctl not found: this host does not run systemd (use --no-systemd and start "
            "`cloudgpu-agent run` with your own supervisor)"
        ) from None
    except subprocess.TimeoutExpired:
        raise ServiceError(f"systemctl {' '.join(args)} did not finish in time") from None
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        raise ServiceError(f"systemctl {' '.join(args)} failed: {detail}")


def require_root(
    no_systemd: bool, hint: str = "--no-systemd --unit-dir DIR to only write the unit file"
) -> None:
    if not no_systemd and os.geteuid() != 0:
        raise ServiceError(
            f"managing the systemd service needs root: run it with sudo (or pass {hint})"
        )


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def install_service(
    prefix: Path, state_dir: Path, unit_dir: Path | None, *, no_systemd: bool
) -> int:
    require_root(no_systemd)
    text = render_unit(prefix, state_dir)
    if unit_dir is None and no_systemd:
        # --no-systemd promises nothing under /etc is touched: without --unit-dir, show the unit.
        sys.stdout.write(text)
        print(f"--no-systemd: wrote nothing (pass --unit-dir DIR to write {UNIT_NAME} there)")
        return 0
    unit_dir = unit_dir or DEFAULT_UNIT_DIR
    agent = _checked_path("prefix", prefix) / "venv" / "bin" / "cloudgpu-agent"
    if not agent.exists():
        message = f"{agent} does not exist yet; install the agent under {prefix} first"
        if not no_systemd:
            raise ServiceError(message)
        print(f"warning: {message}", file=sys.stderr)
    unit_path = unit_dir / UNIT_NAME
    try:
        current = unit_path.read_text()
    except FileNotFoundError:
        current = None
    except OSError as exc:
        raise ServiceError(f"cannot read {unit_path}: {exc.strerror}") from None
    changed = current != text
    if changed:
        try:
            _write_atomically(unit_path, text)
        except OSError as exc:
            raise ServiceError(f"cannot write {unit_path}: {exc.strerror}") from None
        print(f"wrote {unit_path}")
    else:
        print(f"{unit_path} is already up to date")
    if no_systemd:
        reload = "systemctl daemon-reload; " if changed else ""
        print(f"--no-systemd: not running: {reload}systemctl enable --now {SERVICE}")
        return 0
    # enable --now even when the unit is unchanged: it is idempotent and starts a stopped agent.
    if changed:
        _systemctl("daemon-reload")
    _systemctl("enable", "--now", SERVICE)
    print(f"{SERVICE} is enabled and running (journalctl -u {SERVICE} for its log)")
    return 0


def uninstall_service(unit_dir: Path | None, *, no_systemd: bool) -> int:
    require_root(no_systemd)
    if unit_dir is None and no_systemd:
        print(f"--no-systemd: removed nothing (pass --unit-dir DIR to remove {UNIT_NAME} there)")
        return 0
    unit_path = (unit_dir or DEFAULT_UNIT_DIR) / UNIT_NAME
    if not unit_path.exists():
        print(f"{unit_path} is not installed; nothing to do")
        return 0
    if no_systemd:
        print(f"--no-systemd: not running: systemctl disable --now {SERVICE}")
    else:
        # Stops the agent only (KillMode=process): renters' containers keep running.
        _systemctl("disable", "--now", SERVICE)
    try:
        unit_path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ServiceError(f"cannot remove {unit_path}: {exc.strerror}") from None
    print(f"removed {unit_path}")
    if not no_systemd:
        _systemctl("daemon-reload")
    return 0


def systemd_problem() -> str | None:
    """Why ``upgrade`` could not restart the service on this host, or None. Asked before
    anything is downloaded: finding out at the restart cost a download, a build and a smoke."""
    if not SYSTEMD_RUNNING_DIR.is_dir():
        return f"systemd is not running on this host ({SYSTEMD_RUNNING_DIR} does not exist)"
    if shutil.which("systemctl") is None:
        return "systemctl is not on PATH"
    load = _service_status("LoadState").get("LoadState") or "unknown"
    if load != "loaded":
        return f"the {UNIT_NAME} unit is not installed (systemd says LoadState={load})"
    return None


def _service_status(*properties: str) -> dict[str, str]:
    properties = properties or ("ActiveState", "MainPID", "NRestarts")
    try:
        result = subprocess.run(
            ["systemctl", "show", SERVICE, *(arg for p in properties for arg in ("-p", p))],
            capture_output=True,
            text=True,
            timeout=SYSTEMCTL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ActiveState": f"unknown ({exc})"}
    pairs = (line.partition("=") for line in result.stdout.splitlines())
    return {key: value for key, _, value in pairs}


def watch_service(window_s: float, poll_s: float = 0.5) -> str | None:
    """Watch the freshly restarted service for ``window_s``: ``None`` if it stayed up as one
    process, else why not. A version that passes ``smoke`` can still die in ``run``, and under
    ``Restart=always`` that shows as a new MainPID or a higher NRestarts, not as "failed"."""
    first = _service_status()
    if first.get("ActiveState") != "active":
        return f"{SERVICE} is {first.get('ActiveState') or 'not running'} right after the restart"
    end = time.monotonic() + window_s
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(poll_s, left))  # a poll interval, not a synchronisation
        now = _service_status()
        if now.get("ActiveState") != "active":
            return f"{SERVICE} stopped ({now.get('ActiveState')}) within {window_s:g} s"
        if now.get("MainPID") != first.get("MainPID") or now.get("NRestarts") != first.get(
            "NRestarts"
        ):
            return f"{SERVICE} restarted (crashed) within {window_s:g} s"
    return None
