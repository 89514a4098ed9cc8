"""From a template (or a custom image) and a renter's overrides to a checked LeaseSpec."""

from __future__ import annotations

import dataclasses
from typing import Any

from hub.accounts.models import User
from hub.accounts.ssh_keys import authorized_keys_lines
from hub.catalog.models import Template
from hub.leases.services import LeaseError, LeaseSpec
from supplier_agent.protocol import (
    MAX_PORTS,
    MAX_STR,
    ProtocolError,
    validate_env,
    validate_image,
    validate_port,
)


def lease_spec(
    template: Template | None,
    *,
    image: str | None = None,
    ports: list[Any] | None = None,
    env: dict[str, Any] | None = None,
    command: list[str] | None = None,
    warmup: list[str] | None = None,
    access_protected: bool = False,
) -> LeaseSpec:
    """The renter's choices over the template's; every value checked with the protocol's own
    validators, so a bad image or port is refused here with a clear message, not by the agent."""
    if template is None and not image:
        raise LeaseError("choose a template or give an image")
    try:
        chosen_image = validate_image(image or template.image)  # type: ignore[union-attr]
        chosen_ports = list(ports if ports is not None else (template.ports if template else []))
        if len(chosen_ports) > MAX_PORTS:
            raise ProtocolError(f"at most {MAX_PORTS} ports")
        checked_ports = [validate_port(p, f"port {p!r}") for p in chosen_ports]
        if len(set(checked_ports)) != len(checked_ports):
            raise ProtocolError("a port is listed twice")
        merged_env = {**(template.env if template else {}), **(env or {})}
        checked_env = validate_env(merged_env)
    except ProtocolError as exc:
        raise LeaseError(str(exc)) from None
    if command is not None and (
        not isinstance(command, list) or not all(isinstance(a, str) for a in command)
    ):
        raise LeaseError("command must be a list of strings")
    if warmup is not None and (
        not isinstance(warmup, list) or not all(isinstance(a, str) for a in warmup)
    ):
        raise LeaseError("the warm-up must be a list of strings")
    cache_volume = None
    if template is not None and template.cache_path_refusal() is not None:
        # Saved before the mount rule, or past the admin form: the host would refuse it.
        raise LeaseError(
            f"template {template.slug!r} has a cache folder no host accepts "
            f"({template.cache_volume_path[:80]!r}); choose another template"
        )
    if template is not None and template.cache_volume_path:
        cache_volume = {"name": f"template-{template.slug}", "path": template.cache_volume_path}
    return LeaseSpec(
        image=chosen_image,
        ports=checked_ports,
        env=checked_env,
        command=command if command is not None else (template.command if template else None),
        entrypoint=template.entrypoint if template else None,
        # An empty list is the renter's "no warm-up" over the template's.
        warmup=(warmup or None)
        if warmup is not None
        else (template.warmup or None if template else None),
        cache_volume=cache_volume,
        access_protected=access_protected,
    )


def with_account_keys(spec: LeaseSpec, template: Template | None, renter: User) -> LeaseSpec:
    """A template that takes the account's SSH keys (``authorized_keys_env``) gets them in that
    variable, one per line, after any value the renter gave it themselves. An env value holds
    at most MAX_STR (4096) characters: the newest keys that fit go in (ten ed25519 keys take
    under 1,000; five RSA-4096 keys fit)."""
    name = template.authorized_keys_env if template is not None else ""
    if not name:
        return spec
    own = spec.env.get(name, "").strip()
    lines = [own] if own else []
    for line in authorized_keys_lines(renter):
        if line not in lines and len("\n".join([*lines, line])) <= MAX_STR:
            lines.append(line)
    return dataclasses.replace(spec, env={**spec.env, name: "\n".join(lines)})
