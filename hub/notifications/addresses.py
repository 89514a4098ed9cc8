"""Where a webhook may go: https to a public address; never to a private or reserved one,
which from the hub means its own network (the rule rentals' egress follows, with the same
lists: supplier_agent/egress.py). http is allowed only to loopback, and loopback only when
WEBHOOK_ALLOW_LOOPBACK is on (a developer's receiver on their laptop; DEBUG's default).

Checked twice: when an endpoint is saved (its URL's form and a literal address) and at every
delivery, against every address its name resolves to then; the request goes to the address
that was checked, so a name that changes its answer between the two cannot steer it."""

from __future__ import annotations

import ipaddress
import logging
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from supplier_agent.egress import BLOCKED_V4, BLOCKED_V6, GLOBAL_EXCEPTIONS_V6

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
log = logging.getLogger(__name__)

_BLOCKED = tuple(ipaddress.ip_network(n) for n in (*BLOCKED_V4, *BLOCKED_V6))
_EXCEPTIONS = tuple(ipaddress.ip_network(n) for n in GLOBAL_EXCEPTIONS_V6)
MAX_URL_LENGTH = 500


class EndpointRefused(ValueError):
    """The URL or the address it resolves to may not receive webhooks; the message says why."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as in the URL (the Host header and the TLS name)
    port: int
    path: str  # path and query
    address: str  # the checked address the request connects to


def _loopback_allowed() -> bool:
    return bool(settings.WEBHOOK_ALLOW_LOOPBACK)


# IPv6 forms that carry an IPv4 address a gateway may translate to: NAT64's well-known prefix
# and the deprecated IPv4-compatible addresses (RFC 4291). Judged by the IPv4 address inside.
_EMBEDDING_V4 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("::/96"))


def address_problem(address: IPAddress) -> str | None:
    """Why a webhook may not go to ``address``, or None."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif any(address in net for net in _EMBEDDING_V4) and int(address) > 1:
            address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.is_loopback:
        return None if _loopback_allowed() else f"{address} is a loopback address"
    if any(address in net for net in _EXCEPTIONS):
        return None
    if any(address in net for net in _BLOCKED if net.version == address.version):
        return f"{address} is a private or reserved address"
    return None


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def ascii_host(host: str) -> str:
    """The name as it goes on the wire (IDNA: bücher.de is xn--bcher-kva.de)."""
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise EndpointRefused(f"{host!r} is not a valid host name") from None


def check_url(url: str) -> None:
    """Raise EndpointRefused unless ``url`` may be saved as an endpoint."""
    if len(url) > MAX_URL_LENGTH:
        raise EndpointRefused(f"the URL is longer than {MAX_URL_LENGTH} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise EndpointRefused("the URL may not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EndpointRefused(f"not a URL: {exc}") from None
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme not in ("https", "http") or not host:
        raise EndpointRefused("the URL must start with https:// and name a host")
    if parts.username is not None or parts.password is not None:
        raise EndpointRefused("the URL may not carry a user name or password")
    if parts.fragment:
        raise EndpointRefused("the URL may not have a #fragment")
    if port == 0:
        raise EndpointRefused("port 0 is not a port")
    literal = _literal(host)
    if literal is None:
        host = ascii_host(host)
    try:
        httpx.URL(url)  # what the delivery will build its request from
    except httpx.InvalidURL as exc:
        raise EndpointRefused(f"not a URL: {exc}") from None
    loopback = host == "localhost" or host.endswith(".localhost")
    if literal is not None:
        problem = address_problem(literal)
        if problem:
            raise EndpointRefused(f"webhooks cannot go to {problem.split(' is ', 1)[1]}: {host}")
        loopback = literal.is_loopback
    if parts.scheme == "http" and not (loopback and _loopback_allowed()):
        raise EndpointRefused(
            "webhooks go over https only (plain http only to loopback in development)"
        )
    if loopback and not _loopback_allowed():
        raise EndpointRefused("webhooks cannot go to loopback addresses")


def lookup(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to now (none when it does not). The one place a name
    is resolved: tests that need a name of their own answer it here."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        log.info("webhook host %s does not resolve: %s", host, exc)
        return []
    return [str(info[4][0]).split("%", 1)[0] for info in infos]


def resolve(url: str) -> Target:
    """The checked address to deliver ``url`` to, resolving its name now. Every address the
    name has must be allowed: one private answer among public ones refuses it."""
    check_url(url)
    parts = urlsplit(url)
    host = (parts.hostname or "").rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    literal = _literal(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        host = ascii_host(host)
        addresses = [ipaddress.ip_address(a) for a in lookup(host, port)]
    problems = [p for p in map(address_problem, addresses) if p] if addresses else ["none"]
    if problems:
        # The same words for "no answer" and "a private answer", and no address: the
        # delivery log is the account's to read, and must not map the hub's own network.
        log.info("webhook host %s refused: %s", host, "; ".join(problems))
        raise EndpointRefused(f"{host} does not resolve to a public address")
    return Target(parts.scheme, host, port, path, str(addresses[0]))
