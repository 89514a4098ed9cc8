"""Fetching a release for ``cloudgpu-agent upgrade``: the URL rule, one overall deadline, and
downloads that say *why* they failed (cut short, timed out, not served) in one line.

The URL rule is the installer's too (``install.sh``): https only, on every hop of a redirect;
plain http only to a real loopback host; no credentials in a URL.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

from supplier_agent import __version__
from supplier_agent.config import is_loopback

RELEASE_PATH = "/agent/release.json"
HTTP_TIMEOUT_S = 30
MAX_RELEASE_BYTES = 64 * 1024
MAX_WHEEL_BYTES = 200 * 1024 * 1024
MAX_SIGNATURES = 8

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
    # Signed releases (release_signing.py): who signed, and the keys later ones may use.
    signatures: tuple[dict[str, str], ...] = ()
    next_keys: tuple[str, ...] = ()


class Deadline:
    """One budget for the whole upgrade. Each step's own limit is cut to what is left, so the
    step limits can no longer add up past it (they used to: 2,220 s against a 600 s promise)."""

    def __init__(self, total_s: float) -> None:
        self.total_s = total_s
        self._end = time.monotonic() + total_s

    def remaining(self) -> float:
        return self._end - time.monotonic()

    def limit(self, step: str, step_limit_s: float) -> float:
        """The time ``step`` may take; raises if the budget is already spent."""
        left = self.remaining()
        if left <= 0:
            raise self.overran(step)
        return min(step_limit_s, left)

    def overran(self, step: str) -> UpgradeError:
        return UpgradeError(f"timed out: the upgrade ran past its {self.total_s:g} s budget {step}")


def version_key(version: str) -> tuple[int, ...]:
    """``1.10.0rc1`` -> ``(1, 10, 0)``: enough to tell an older release from a newer one
    (our versions are plain numbers; a pre-release sorts with its release)."""
    numbers: list[int] = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.end() != len(part):
            break
    return tuple(numbers)


def release_url_for(hub_url: str) -> str:
    """``https://hub.example.com`` (or its ``wss://`` form) -> ``.../agent/release.json``."""
    parts = urlsplit(hub_url.strip())
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, RELEASE_PATH, "", ""))


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if not parts.hostname or parts.username or parts.password:
        raise UpgradeError(f"not a usable download URL (no host, or credentials in it): {url!r}")
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


def _set_read_timeout(response: Any, seconds: float) -> bool:
    """Give the response's socket a new timeout for the next read; False where it cannot be
    reached. urllib sets the timeout once, at the open, from what the budget had left then; a
    download must wait no longer per read than what it has left now. The socket sits behind
    the standard library's ``SocketIO._sock`` (as in compat_docker.py): checked, never assumed."""
    sock = getattr(getattr(getattr(response, "fp", None), "raw", None), "_sock", None)
    settimeout = getattr(sock, "settimeout", None)
    if not callable(settimeout):
        return False
    settimeout(seconds)
    return True


def _seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _open(url: str, step: str, deadline: Deadline) -> tuple[Any, float]:
    """The open response and the timeout its socket got (the 30 s, or less budget left)."""
    check_url(url)
    handlers: list[urllib.request.BaseHandler] = [_CheckedRedirects()]
    if is_loopback(urlsplit(url).hostname or ""):
        handlers.append(urllib.request.ProxyHandler({}))  # a proxy cannot reach our loopback
    opener = urllib.request.build_opener(*handlers)
    # check_url above allowed only https:// and loopback http:// (S310).
    request = urllib.request.Request(  # noqa: S310
        url, headers={"User-Agent": f"cloudgpu-agent/{__version__}"}
    )
    timeout_s = deadline.limit(step, HTTP_TIMEOUT_S)
    try:
        return opener.open(request, timeout=timeout_s), timeout_s
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            host = urlsplit(url).netloc
            raise UpgradeError(
                f"{host} was reached, but it serves no agent release at {url} (HTTP 404): "
                "check the hub URL"
            ) from None
        raise UpgradeError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except TimeoutError:
        raise UpgradeError(f"timed out {step}: {url} did not answer in {timeout_s:.0f} s") from None
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise UpgradeError(
                f"timed out {step}: {url} did not answer in {timeout_s:.0f} s"
            ) from None
        raise UpgradeError(f"cannot reach {url}: {reason}") from None


def fetch_release(url: str, deadline: Deadline) -> Release:
    step = "reading the release description"
    response, _timeout_s = _open(url, step, deadline)
    with response:
        try:
            body = response.read(MAX_RELEASE_BYTES + 1)
        except (OSError, http.client.HTTPException):
            raise UpgradeError(f"{url}: the release description was cut short") from None
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
    signatures = data.get("signatures", [])
    next_keys = data.get("next_keys", [])
    if not (
        isinstance(signatures, list)
        and len(signatures) <= MAX_SIGNATURES
        and all(
            isinstance(s, dict) and all(isinstance(s.get(k), str) for k in ("key", "sig"))
            for s in signatures
        )
    ):
        raise UpgradeError(f"{url}: signatures must be a short list of {{key, sig}} strings")
    if not (
        isinstance(next_keys, list)
        and len(next_keys) <= MAX_SIGNATURES
        and all(isinstance(k, str) for k in next_keys)
    ):
        raise UpgradeError(f"{url}: next_keys must be a short list of strings")
    return Release(
        version=fields["version"],
        filename=fields["filename"],
        sha256=sha256,
        url=check_url(urljoin(url, fields["url"])),
        signatures=tuple({"key": s["key"], "sig": s["sig"]} for s in signatures),
        next_keys=tuple(next_keys),
    )


def download(url: str, dest: Path, deadline: Deadline) -> str:
    """Stream ``url`` into ``dest`` (created 0600) and return its sha256 hex digest.

    A transfer that ends early raises "incomplete download" (not a checksum mismatch, which
    would suggest tampering); one that trickles past the budget raises "timed out"."""
    step = "downloading the wheel"
    digest = hashlib.sha256()
    size = 0
    response, idle_s = _open(url, step, deadline)
    with (
        response,
        os.fdopen(os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out,
    ):
        while True:
            left = deadline.remaining()
            if left <= 0:
                raise deadline.overran(f"{step} ({size} bytes of {url} so far)")
            # Each read waits at most 30 s, and never past the budget; the message then says
            # the limit that ran out (it used to say 30 s under `--timeout 25`).
            if _set_read_timeout(response, min(HTTP_TIMEOUT_S, left)):
                idle_s = min(HTTP_TIMEOUT_S, left)
            try:
                # read1: whatever has arrived, so a slow sender cannot hold us past the budget.
                chunk = response.read1(1 << 16)
            except TimeoutError:
                silent = f"{url} sent nothing for {_seconds(idle_s)} s ({size} bytes so far)"
                if idle_s < HTTP_TIMEOUT_S:  # the budget, not the sender's 30 s, ran out
                    raise deadline.overran(f"{step}: {silent}") from None
                raise UpgradeError(f"timed out {step}: {silent}") from None
            except (OSError, http.client.HTTPException):
                raise UpgradeError(
                    f"incomplete download of {url}: the connection broke after {size} bytes; "
                    "nothing was changed, try again"
                ) from None
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_WHEEL_BYTES:
                raise UpgradeError(f"{url}: larger than {MAX_WHEEL_BYTES >> 20} MiB")
            digest.update(chunk)
            out.write(chunk)
        missing = response.length  # what Content-Length promised and never came; None if chunked
    if missing:
        raise UpgradeError(
            f"incomplete download of {url}: got {size} of {size + missing} bytes; "
            "nothing was changed, try again"
        )
    return digest.hexdigest()
