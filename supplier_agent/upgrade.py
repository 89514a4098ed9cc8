"""``cloudgpu-agent upgrade``: install the hub's current agent wheel next to the running one,
smoke-test it, then switch to it.

A virtualenv cannot be moved (its scripts name their interpreter by absolute path), so every
version gets its own ``<prefix>/venvs/<version>/`` and ``<prefix>/venv`` is a symlink to the
current one, replaced in one ``rename``. The systemd unit starts
``<prefix>/venv/bin/cloudgpu-agent``, so the switch is the symlink plus a service restart.

Nothing changes until the new version has passed ``version`` and ``smoke`` from its own
virtualenv; a failure deletes the side virtualenv and leaves the running one alone. The previous
version's folder stays for one manual rollback. Containers are never touched: they belong to
dockerd and the restarted agent re-adopts them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from supplier_agent import __version__
from supplier_agent.config import is_loopback
from supplier_agent.service import SERVICE, SYSTEMCTL_TIMEOUT_S, ServiceError, require_root

RELEASE_PATH = "/agent/release.json"
HTTP_TIMEOUT_S = 30
MAX_RELEASE_BYTES = 64 * 1024
MAX_WHEEL_BYTES = 200 * 1024 * 1024
VENV_TIMEOUT_S = 300
PIP_TIMEOUT_S = 1800
CHECK_TIMEOUT_S = 60  # smoke gives up after 10 s itself
LEGACY_PREVIOUS = "venv.previous"

# The version names a folder: no separators, no "..", nothing a shell would trip on.
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!_-]{0,63}$")
_WHEEL_NAME = re.compile(r"^cloudgpu_agent-[0-9A-Za-z.+!_-]+-[0-9A-Za-z._-]+\.whl$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class UpgradeError(RuntimeError):
    """The upgrade stopped; the message says why and what state the installation is in."""


@dataclass(frozen=True)
class Release:
    version: str
    filename: str
    sha256: str
    url: str


# --- fetching ------------------------------------------------------------------------------


def release_url_for(hub_url: str) -> str:
    """``https://hub.example.com`` (or its ``wss://`` form) -> ``.../agent/release.json``."""
    parts = urlsplit(hub_url.strip())
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, RELEASE_PATH, "", ""))


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if not parts.hostname or parts.username or parts.password:
        raise UpgradeError(f"not a usable download URL: {url!r}")
    if parts.scheme == "https":
        return url
    if parts.scheme == "http" and is_loopback(parts.hostname):
        return url
    raise UpgradeError(
        f"refusing {url!r}: downloads must use https:// (plain http only on loopback)"
    )


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    # urllib follows https -> http redirects; every hop must pass the same rule as the first.
    def redirect_request(
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        check_url(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _open(url: str) -> Any:
    check_url(url)
    handlers: list[urllib.request.BaseHandler] = [_CheckedRedirects()]
    if is_loopback(urlsplit(url).hostname or ""):
        handlers.append(urllib.request.ProxyHandler({}))  # a proxy cannot reach our loopback
    opener = urllib.request.build_opener(*handlers)
    # check_url above allowed only https:// and loopback http:// (S310).
    request = urllib.request.Request(  # noqa: S310
        url, headers={"User-Agent": f"cloudgpu-agent/{__version__}"}
    )
    try:
        return opener.open(request, timeout=HTTP_TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        raise UpgradeError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise UpgradeError(f"cannot reach {url}: {reason}") from None


def fetch_release(url: str) -> Release:
    with _open(url) as response:
        body = response.read(MAX_RELEASE_BYTES + 1)
    if len(body) > MAX_RELEASE_BYTES:
        raise UpgradeError(f"{url}: the release description is too large")
    try:
        data = json.loads(body)
        fields = {key: data[key] for key in ("version", "filename", "sha256", "url")}
    except (ValueError, TypeError, KeyError):
        raise UpgradeError(
            f"{url}: not a release description (want version, filename, sha256, url)"
        ) from None
    if not all(isinstance(value, str) for value in fields.values()):
        raise UpgradeError(f"{url}: release fields must be strings")
    if not _VERSION.match(fields["version"]):
        raise UpgradeError(f"{url}: unexpected version {fields['version']!r}")
    if not _WHEEL_NAME.match(fields["filename"]):
        raise UpgradeError(f"{url}: unexpected wheel file name {fields['filename']!r}")
    sha256 = fields["sha256"].lower()
    if not _SHA256.match(sha256):
        raise UpgradeError(f"{url}: sha256 must be 64 hex digits")
    return Release(
        version=fields["version"],
        filename=fields["filename"],
        sha256=sha256,
        url=check_url(urljoin(url, fields["url"])),
    )


def download(url: str, dest: Path) -> str:
    """Stream ``url`` into ``dest`` (created 0600) and return its sha256 hex digest."""
    digest = hashlib.sha256()
    size = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, _open(url) as response:
        while chunk := response.read(1 << 16):
            size += len(chunk)
            if size > MAX_WHEEL_BYTES:
                raise UpgradeError(f"{url}: larger than {MAX_WHEEL_BYTES >> 20} MiB")
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


# --- the installation under the prefix -----------------------------------------------------


@contextlib.contextmanager
def _upgrade_lock(prefix: Path) -> Iterator[None]:
    fd = os.open(prefix / ".upgrade.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UpgradeError(f"another upgrade of {prefix} is running") from None
        yield
    finally:
        os.close(fd)  # drops the lock


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout_s:.0f} s")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"cannot run {argv[0]}: {exc}")


def _tail(result: subprocess.CompletedProcess[str], lines: int = 8) -> str:
    text = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return "\n    ".join(text[-lines:]) or "(no output)"


def _free_dir(venvs: Path, version: str) -> Path:
    # The same version again (--force) gets a fresh folder: the running one is never rebuilt.
    candidate, n = venvs / version, 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = venvs / f"{version}-{n}"
    return candidate


def _build_side_venv(target: Path, wheel: Path, release: Release, state_dir: Path) -> None:
    """Create ``target`` with the wheel installed and prove it works; delete it if not."""
    steps: list[tuple[str, list[str], float]] = [
        ("create the virtualenv", [sys.executable, "-m", "venv", str(target)], VENV_TIMEOUT_S),
        (
            "install the wheel",
            [
                str(target / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                str(wheel),
            ],
            PIP_TIMEOUT_S,
        ),
    ]
    agent = str(target / "bin" / "cloudgpu-agent")
    try:
        for what, argv, timeout_s in steps:
            print(f"upgrade: {what}")
            result = _run(argv, timeout_s)
            if result.returncode != 0:
                raise UpgradeError(f"could not {what} in {target}:\n    {_tail(result)}")
        result = _run([agent, "version"], CHECK_TIMEOUT_S)
        if result.returncode != 0 or not result.stdout.startswith(
            f"cloudgpu-agent {release.version} "
        ):
            raise UpgradeError(
                f"the new agent does not report version {release.version} "
                f"(exit {result.returncode}):\n    {_tail(result)}"
            )
        print(f"upgrade: smoke test of {release.version} against the hub")
        result = _run([agent, "smoke", "--state", str(state_dir)], CHECK_TIMEOUT_S)
        if result.returncode != 0:
            raise UpgradeError(
                f"version {release.version} failed its smoke test "
                f"(exit {result.returncode}):\n    {_tail(result)}"
            )
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _swap(prefix: Path, target: Path) -> Path | None:
    """Point ``<prefix>/venv`` at ``target``; return what it pointed at before."""
    link = prefix / "venv"
    tmp_link = prefix / ".venv.swap"
    with contextlib.suppress(FileNotFoundError):
        tmp_link.unlink()
    tmp_link.symlink_to(target.relative_to(prefix))
    previous: Path | None
    if link.is_symlink():
        previous = link.resolve()
    else:
        # A plain virtualenv from an older installer: keep it whole, under a name that can be
        # renamed back to `venv` (its scripts need that exact path to run).
        legacy = prefix / LEGACY_PREVIOUS
        if legacy.exists():
            shutil.rmtree(legacy)
        os.rename(link, legacy)
        previous = legacy
    os.replace(tmp_link, link)  # rename(2): readers see the old or the new venv, never neither
    dir_fd = os.open(prefix, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return previous


def _prune(prefix: Path, keep: set[Path]) -> None:
    """Remove versions older than the previous one (one manual rollback is kept)."""
    keep = {path.resolve() for path in keep}
    candidates = [*sorted((prefix / "venvs").iterdir()), prefix / LEGACY_PREVIOUS]
    for path in candidates:
        if path.is_dir() and not path.is_symlink() and path.resolve() not in keep:
            print(f"upgrade: removing old version {path}")
            shutil.rmtree(path, ignore_errors=True)


def upgrade(
    prefix: Path,
    state_dir: Path,
    release_url: str,
    *,
    no_systemd: bool = False,
    force: bool = False,
) -> int:
    try:
        # Checked before anything changes, not at the restart.
        require_root(no_systemd, "--no-systemd and restart the agent yourself")
    except ServiceError as exc:
        raise UpgradeError(str(exc)) from None
    prefix = prefix.absolute()
    link = prefix / "venv"
    if not (link / "bin" / "cloudgpu-agent").exists():
        raise UpgradeError(f"no agent installed at {link}; run the installer first")
    with _upgrade_lock(prefix):
        print(f"upgrade: reading {release_url}")
        release = fetch_release(release_url)
        if release.version == __version__ and not force:
            print(f"upgrade: already at version {__version__}; nothing to do (--force reinstalls)")
            return 0
        print(f"upgrade: {__version__} -> {release.version}")
        with tempfile.TemporaryDirectory(prefix="cloudgpu-upgrade-") as tmp:  # mode 0700
            wheel = Path(tmp) / release.filename
            print(f"upgrade: downloading {release.url}")
            digest = download(release.url, wheel)
            if not hmac.compare_digest(digest, release.sha256):
                raise UpgradeError(
                    f"sha256 mismatch for {release.filename}: the hub says {release.sha256}, "
                    f"the download is {digest}; refusing it, nothing was changed"
                )
            venvs = prefix / "venvs"
            venvs.mkdir(mode=0o755, exist_ok=True)
            target = _free_dir(venvs, release.version)
            try:
                _build_side_venv(target, wheel, release, state_dir)
            except UpgradeError as exc:
                raise UpgradeError(
                    f"{exc}\nrolled back: removed {target}; {link} still runs {__version__}"
                ) from None
        previous = _swap(prefix, target)
        print(f"upgrade: {link} -> {target}")
        _prune(prefix, {target, *([previous] if previous else [])})
        if no_systemd:
            print(f"--no-systemd: not running: systemctl restart {SERVICE}")
        else:
            # The agent stops (KillMode=process), containers keep running and are re-adopted.
            result = _run(["systemctl", "restart", SERVICE], SYSTEMCTL_TIMEOUT_S)
            if result.returncode != 0:
                raise UpgradeError(
                    f"switched to {release.version}, but `systemctl restart {SERVICE}` failed:"
                    f"\n    {_tail(result)}"
                )
            print(f"upgrade: restarted {SERVICE}")
        restart = "" if no_systemd else f" && systemctl restart {SERVICE}"
        if previous is None:
            print("upgrade: done")
        elif previous.name == LEGACY_PREVIOUS:
            print(f"upgrade: done. To go back: rm {link} && mv {previous} {link}{restart}")
        else:
            print(
                f"upgrade: done. To go back: ln -sfn {previous} {link}.swap && "
                f"mv -T {link}.swap {link}{restart}"
            )
        return 0
