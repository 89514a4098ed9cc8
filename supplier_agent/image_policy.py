"""Which images a rental may run on a supplier's host, decided before anything is pulled.

A renter names the image, and so the registry dockerd connects to. Unchecked, that made the
supplier's dockerd a port scanner of the supplier's own network (``127.0.0.1:5000/x``,
``192.168.1.1/x``), with the error text coming back to the renter. And an image's own config
can carry loader variables that the NVIDIA container hook honours on the host
(CVE-2025-23266), which the renter-env check never saw.

The textual rules (``registry_refusal``) are shared with the hub, which refuses the same images
at rent time with the same sentence; the agent also resolves registry names, since a public
name can point at a private address.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# Names that only make sense on a local network, whatever they resolve to.
LAN_SUFFIXES = (".local", ".lan", ".home", ".internal", ".intranet", ".home.arpa", ".localhost")
# Loader variables that inject code into every process of the container, and into the
# NVIDIA hook that runs on the host with an image's environment (CVE-2025-23266).
# LD_LIBRARY_PATH is not among them: CUDA images set it, and the fixed hook ignores it.
IMAGE_ENV_REFUSED = ("LD_PRELOAD", "LD_AUDIT")

Resolver = Callable[[str], Iterable[str]]


def registry_of(image: str) -> str | None:
    """The registry host[:port] an image reference names, or None for Docker Hub.

    Docker's rule: the first path component is a registry when it has a dot or a colon, or is
    ``localhost``.
    """
    first, slash, _ = image.partition("/")
    if not slash:
        return None
    if "." in first or ":" in first or first == "localhost":
        return first
    return None


def _split_host(registry: str) -> str:
    if registry.startswith("["):  # [v6]:port
        return registry[1:].partition("]")[0]
    host, _, _ = registry.rpartition(":") if registry.count(":") == 1 else (registry, "", "")
    return host.lower()


def _address_refusal(address: str) -> str | None:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        return "a reserved address"
    if not ip.is_global:
        return "a private address"
    return None


def registry_refusal(image: str) -> str | None:
    """Why an image's registry may not be used (from the text alone), or None."""
    registry = registry_of(image)
    if registry is None:
        return None
    host = _split_host(registry)
    reason = _address_refusal(host)
    if reason is None and (host == "localhost" or "." not in host):
        reason = "a single-label name"
    if reason is None and host.endswith(LAN_SUFFIXES):
        reason = "a local-network name"
    if reason is None:
        return None
    return (
        f"image {image} names a registry on {reason} ({registry}): rentals may pull only "
        "from public registries"
    )


def system_resolver(host: str) -> list[str]:
    return [str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)]


def resolved_refusal(image: str, resolve: Resolver = system_resolver) -> str | None:
    """``registry_refusal``, plus: the registry's name must not resolve to a non-public address
    on this host (a public name pointing at the LAN, or DNS rebinding)."""
    refusal = registry_refusal(image)
    registry = registry_of(image)
    if refusal is not None or registry is None:
        return refusal
    host = _split_host(registry)
    if _address_refusal(host) is None and any(c.isalpha() for c in host):
        try:
            addresses = list(resolve(host))
        except OSError:
            return None  # the pull fails on its own, with the generic unreachable sentence
        for address in addresses:
            reason = _address_refusal(address)
            if reason is not None:
                return (
                    f"image {image} names a registry that resolves to {reason} on this host: "
                    "rentals may pull only from public registries"
                )
    return None


def image_env_refusal(image: str, config_env: Sequence[str] | None) -> str | None:
    """Why an image's own ENV lines may not run here, or None."""
    for line in config_env or ():
        name = line.partition("=")[0]
        if name in IMAGE_ENV_REFUSED:
            return (
                f"image {image} sets {name} in its configuration, which would load code into "
                "the NVIDIA container hook on the host (CVE-2025-23266); it cannot be rented out"
            )
    return None


def config_env(attrs: dict[str, Any]) -> list[str]:
    """The ENV lines of an image as the Docker API describes it."""
    return list((attrs.get("Config") or {}).get("Env") or [])
