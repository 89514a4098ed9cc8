"""The hub's REST API over httpx, every failure turned into one CliError line."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from typing import Any

import httpx

from cloudgpu_cli import __version__
from cloudgpu_cli.errors import AUTH, FAILED, HUB_ERROR, UNREACHABLE, CliError

CONNECT_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 30.0
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


def refusal(code: int, detail: str) -> CliError:
    """The CliError for an HTTP error status; shared with the terminal's WebSocket handshake."""
    if code in (401, 403):
        hint = "" if code == 403 else " (run `cloudgpu login` with a valid token)"
        return CliError(f"token refused by the hub: {detail}{hint}", AUTH)
    if code >= 500:
        return CliError(f"hub error {code}: {detail}", HUB_ERROR)
    # 409 (a price raised above --max-price, a lease not running) and 400 (a refusal: out of
    # funds, a GPU just taken) are sentences written for the renter already.
    return CliError(detail, FAILED)


class Api:
    def __init__(self, hub: str, token: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.hub = hub
        self.timeout_s = timeout_s
        self._client = httpx.Client(
            base_url=hub,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
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

    def request(
        self,
        method: str,
        url: str,
        *,
        accept: Collection[int] = (),
        read_timeout_s: float | None = None,
        **kwargs: Any,
    ) -> httpx.Response:
        """The response of a 2xx/3xx or of a status in ``accept``; anything else is a CliError.
        ``read_timeout_s``: for a call the hub answers only when done (exec)."""
        if read_timeout_s is not None:
            kwargs["timeout"] = httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S)
        try:
            response = self._client.request(method, url, **kwargs)
        except httpx.ConnectTimeout:
            raise CliError(f"hub unreachable: {self.hub} timed out", UNREACHABLE) from None
        except httpx.TimeoutException:
            waited = read_timeout_s or self.timeout_s
            # A POST the hub took may have acted before its answer was lost.
            maybe = "" if method == "GET" else "; it may have been done: check `cloudgpu ls`"
            raise CliError(
                f"hub unreachable: {self.hub} did not answer within {waited:.0f} s{maybe}",
                UNREACHABLE,
            ) from None
        except httpx.TransportError as exc:
            # Connection refused, DNS, TLS: the class name and httpx's text say which, and
            # neither carries request headers.
            reason = str(exc) or exc.__class__.__name__
            raise CliError(f"hub unreachable: {self.hub}: {reason}", UNREACHABLE) from None
        code = response.status_code
        if code < 400 or code in accept:
            return response
        raise refusal(code, _detail(response))

    def get(self, url: str, **params: Any) -> Any:
        return self._json(self.request("GET", url, params=params or None))

    def post(self, url: str, body: dict[str, Any] | None = None) -> Any:
        response = self.request("POST", url, json=body or {})
        return self._json(response) if response.content else {}

    def patch(self, url: str, body: dict[str, Any]) -> Any:
        return self._json(self.request("PATCH", url, json=body))

    def delete(self, url: str) -> Any:
        response = self.request("DELETE", url)
        return self._json(response) if response.content else {}

    def _json(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            # A proxy's HTML page where the hub should be: no traceback, one line.
            raise CliError(
                f"hub error: {self.hub} answered {response.status_code} with no JSON", HUB_ERROR
            ) from None

    def pages(self, url: str, params: dict[str, Any], follow: bool) -> Iterator[list[Any]]:
        """The first page, then (with ``follow``) each `Link: rel="next"` page until none."""
        response = self.request("GET", url, params=params)
        while True:
            yield self._json(response)
            link = next_link(response) if follow else None
            if not link:
                return
            response = self.request("GET", link)
