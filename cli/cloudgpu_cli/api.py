"""The hub's REST API over httpx, every failure turned into one CliError line."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx

from cloudgpu_cli import __version__
from cloudgpu_cli.errors import AUTH, FAILED, HUB_ERROR, UNREACHABLE, CliError

TIMEOUT = httpx.Timeout(30.0, connect=10.0)
_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


def _detail(response: httpx.Response) -> str:
    """The API's `detail` sentence plus its per-field messages; the body never holds the
    token (the hub only echoes what it validated), so it is safe to show."""
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    if not isinstance(body, dict):
        return f"HTTP {response.status_code}"
    detail = str(body.get("detail") or f"HTTP {response.status_code}")
    errors = body.get("errors")
    if isinstance(errors, dict) and errors:
        parts = []
        for field, messages in errors.items():
            text = "; ".join(map(str, messages)) if isinstance(messages, list) else str(messages)
            # The hub's detail often is the first field's message already.
            if text not in detail:
                parts.append(f"{field}: {text}")
        if parts:
            detail = f"{detail} ({', '.join(parts)})"
    return " ".join(detail.split())


def next_link(response: httpx.Response) -> str | None:
    match = _NEXT.search(response.headers.get("Link", ""))
    return match.group(1) if match else None


class Api:
    def __init__(self, hub: str, token: str) -> None:
        self.hub = hub
        self._client = httpx.Client(
            base_url=hub,
            timeout=TIMEOUT,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": f"cloudgpu-cli/{__version__}",
            },
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, url, **kwargs)
        except httpx.TimeoutException:
            raise CliError(f"hub unreachable: {self.hub} timed out", UNREACHABLE) from None
        except httpx.TransportError as exc:
            # Connection refused, DNS, TLS: the class name and httpx's text say which, and
            # neither carries request headers.
            reason = str(exc) or exc.__class__.__name__
            raise CliError(f"hub unreachable: {self.hub}: {reason}", UNREACHABLE) from None
        code = response.status_code
        if code < 400:
            return response
        detail = _detail(response)
        if code in (401, 403):
            hint = "" if code == 403 else " (run `cloudgpu login` with a valid token)"
            raise CliError(f"token refused by the hub: {detail}{hint}", AUTH)
        if code == 409:
            raise CliError(f"conflict: {detail}", FAILED)
        if code >= 500:
            raise CliError(f"hub error {code}: {detail}", HUB_ERROR)
        raise CliError(detail, FAILED)

    def get(self, url: str, **params: Any) -> Any:
        return self.request("GET", url, params=params or None).json()

    def post(self, url: str, body: dict[str, Any] | None = None) -> Any:
        response = self.request("POST", url, json=body or {})
        return response.json() if response.content else {}

    def pages(self, url: str, params: dict[str, Any], follow: bool) -> Iterator[list[Any]]:
        """The first page, then (with ``follow``) each `Link: rel="next"` page until none."""
        response = self.request("GET", url, params=params)
        while True:
            yield response.json()
            link = next_link(response) if follow else None
            if not link:
                return
            response = self.request("GET", link)
