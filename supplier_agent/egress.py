"""What a rental's container may reach: the public internet and DNS, not the supplier's network.

Suppliers run the agent at home and in offices, next to routers, NAS boxes and cloud metadata
services; a container on a Docker bridge reaches all of them by default, and the host itself
through the bridge's gateway address. This module installs, and checks, packet-filter rules for
the lease bridge (IPv4 with ``iptables``, IPv6 with ``ip6tables`` where the host has it):

- ``CLOUDGPU-EGRESS`` (jumped to from ``DOCKER-USER``, which Docker consults first for
  forwarded traffic): from the bridge, answers to connections made from outside pass, DNS to
  the host's resolvers passes, the supplier's allowed ranges pass, and every destination that
  IANA's special-purpose address registries mark not globally reachable is dropped: private,
  CGNAT, link-local (169.254.169.254 included), loopback, documentation, benchmarking, reserved,
  6to4 and the like, and multicast with them (the few globally reachable blocks inside
  2001::/23 pass); everything else (the internet) passes. Towards the bridge, new connections
  from anywhere else are dropped: the only way in is the agent's tunnel through the loopback
  port.
- ``CLOUDGPU-INPUT`` (jumped to from ``INPUT``): from the bridge to the host itself, only
  answers and DNS to a resolver on the host pass; nothing else of the host is reachable.
- In the ``raw`` table, packets for 127.0.0.0/8 that arrive on any interface but loopback are
  dropped (moby issue 45610: before Docker 28 a LAN neighbour routing 127/8 to the host reached
  ports published on 127.0.0.1).

Each chain is rewritten whole and atomically (``iptables-restore --noflush``), so running
rentals are never unfiltered for a moment, and a restart or a newer agent never stacks
duplicates; ``missing`` says what is not in place. The agent refuses to start a lease when this
fails, naming the reason.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

EGRESS_CHAIN = "CLOUDGPU-EGRESS"
INPUT_CHAIN = "CLOUDGPU-INPUT"
RAW_CHAIN = "CLOUDGPU-RAW"

# Every entry of IANA's IPv4 and IPv6 special-purpose address registries whose "Globally
# Reachable" is False (or N/A for a deprecated one), plus multicast: from a rental, each of these
# can only mean the supplier's own network or the path to it. The registry lists smaller entries
# inside some of these (0.0.0.0/32 in 0/8, 192.0.0.170/31 in 192.0.0.0/24, 2001:2::/48 in
# 2001::/23, ...); the enclosing entry covers them.
BLOCKED_V4 = (
    "0.0.0.0/8",  # "this network": Linux routes all of it but 0.0.0.0 (since 5.3)
    "10.0.0.0/8",
    "100.64.0.0/10",  # shared address space (carrier-grade NAT)
    "127.0.0.0/8",
    "169.254.0.0/16",  # link-local, cloud metadata
    "172.16.0.0/12",
    # IETF protocol assignments (DS-Lite, NAT64 discovery, ...). Its globally reachable
    # 192.0.0.9 (PCP anycast) and 192.0.0.10 (TURN anycast) stay dropped too: the nearest
    # router answers them, which is the supplier's, and PCP there opens ports on its NAT.
    "192.0.0.0/24",
    "192.0.2.0/24",  # documentation (TEST-NET-1)
    "192.88.99.0/24",  # deprecated 6to4 relay anycast (RFC 7526): relays into 2002::/16
    "192.168.0.0/16",
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # documentation (TEST-NET-2)
    "203.0.113.0/24",  # documentation (TEST-NET-3)
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and 255.255.255.255 (limited broadcast)
)
BLOCKED_V6 = (
    "::/128",  # unspecified
    "::1/128",
    "::ffff:0:0/96",  # IPv4-mapped: never on the wire, and would name IPv4 hosts
    "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation (the supplier's own NAT64)
    "100::/64",  # discard-only
    "100:0:0:1::/64",  # dummy prefix (RFC 9780)
    "2001::/23",  # IETF protocol assignments: Teredo, benchmarking, ORCHID; see the exceptions
    "2001:db8::/32",  # documentation
    "2002::/16",  # 6to4: embeds IPv4 addresses, private ones included
    "3fff::/20",  # documentation
    "5f00::/16",  # segment routing (SRv6) SIDs
    "fc00::/7",  # unique local
    "fe80::/10",  # link-local
    "fec0::/10",  # deprecated site-local (RFC 3879)
    "ff00::/8",  # multicast
)
# The globally reachable entries inside a blocked range: passed before the drops. Not the
# anycast service addresses 2001:1::1 (PCP), 2001:1::2 (TURN) and 2001:1::3 (DNS-SD SRP): like
# their IPv4 twins in 192.0.0.0/24, the nearest router answers them, which is the supplier's;
# PCP there opens ports in its firewall, SRP advertises services on its LAN.
GLOBAL_EXCEPTIONS_V6 = (
    "2001:3::/32",  # AMT (automatic multicast tunneling) relays
    "2001:4:112::/48",  # AS112-v6 (reverse DNS sink for private ranges)
    "2001:20::/28",  # ORCHIDv2 (cryptographic host identifiers)
    "2001:30::/28",  # DRIP DETs (drone remote identification)
)
COMMAND_TIMEOUT_S = 20


class EgressError(Exception):
    """The rules could not be installed or checked; the message says why and what to do."""


@dataclass(frozen=True)
class Family:
    tool: str
    blocked: tuple[str, ...]
    version: int
    exceptions: tuple[str, ...] = ()  # globally reachable parts of ``blocked``: passed first


IPV4 = Family("iptables", BLOCKED_V4, 4)
IPV6 = Family("ip6tables", BLOCKED_V6, 6, GLOBAL_EXCEPTIONS_V6)


def host_resolvers(resolv_conf: Path = Path("/etc/resolv.conf")) -> list[str]:
    """The nameservers the host (and so Docker's embedded DNS) asks."""
    found = []
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            try:
                found.append(str(ipaddress.ip_address(parts[1].split("%", 1)[0])))
            except ValueError:
                continue
    return found


def parse_allowed(text: str | None) -> tuple[str, ...]:
    """The supplier's ``allow_networks`` (comma-separated CIDRs) checked and normalised."""
    networks = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ValueError(
                f"allow_networks: {item!r} is not a network like 10.1.2.0/24"
            ) from None
    return tuple(networks)


def _egress_rules(
    bridge: str, family: Family, resolvers: Sequence[str], allowed: Sequence[str]
) -> list[list[str]]:
    ip_version = family.version
    rules = [
        ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
        # Into the bridge from anywhere else: nothing new (the tunnel comes in through the
        # loopback port, which is not forwarded traffic).
        ["-o", bridge, "!", "-i", bridge, "-j", "DROP"],
    ]
    for resolver in resolvers:
        if ipaddress.ip_address(resolver).version != ip_version:
            continue
        for proto in ("udp", "tcp"):
            rules.append(
                ["-i", bridge, "-d", resolver, "-p", proto, "--dport", "53", "-j", "RETURN"]
            )
    for network in allowed:
        if ipaddress.ip_network(network).version == ip_version:
            rules.append(["-i", bridge, "-d", network, "-j", "RETURN"])
    for network in family.exceptions:
        rules.append(["-i", bridge, "-d", network, "-j", "RETURN"])
    for network in family.blocked:
        rules.append(["-i", bridge, "-d", network, "-j", "DROP"])
    rules.append(["-j", "RETURN"])
    return rules


def _input_rules(bridge: str, family: Family, resolvers: Sequence[str]) -> list[list[str]]:
    rules = [["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"]]
    for resolver in resolvers:
        if ipaddress.ip_address(resolver).version != family.version:
            continue
        for proto in ("udp", "tcp"):
            rules.append(["-d", resolver, "-p", proto, "--dport", "53", "-j", "RETURN"])
    rules.append(["-j", "DROP"])
    return rules


class EgressPolicy:
    """Installs and checks the rules for one lease bridge interface."""

    def __init__(self, allowed: Sequence[str] = (), resolvers: Sequence[str] | None = None) -> None:
        self.allowed = tuple(allowed)
        self.resolvers = tuple(host_resolvers() if resolvers is None else resolvers)

    def _families(self) -> list[Family]:
        if shutil.which(IPV4.tool) is None:
            raise EgressError(
                "iptables is not installed, so rentals could reach this host's network; "
                "install iptables (Docker needs it too)"
            )
        return [IPV4, IPV6] if shutil.which(IPV6.tool) else [IPV4]

    def install(self, bridge: str) -> None:
        for family in self._families():
            _restore(
                family,
                "filter",
                {
                    EGRESS_CHAIN: _egress_rules(bridge, family, self.resolvers, self.allowed),
                    INPUT_CHAIN: _input_rules(bridge, family, self.resolvers),
                },
            )
            # Docker makes DOCKER-USER and jumps to it first thing in FORWARD when its iptables
            # integration is on (for IPv6 only with ip6tables enabled); made here when missing,
            # Docker keeps both and appends its RETURN after our jumps.
            if _run(family, ["-n", "-L", "DOCKER-USER"], check=False).returncode:
                _run(family, ["-N", "DOCKER-USER"])
            self._jump(family, "filter", "FORWARD", ["-j", "DOCKER-USER"])
            self._jump(family, "filter", "DOCKER-USER", ["-i", bridge, "-j", EGRESS_CHAIN])
            self._jump(family, "filter", "DOCKER-USER", ["-o", bridge, "-j", EGRESS_CHAIN])
            self._jump(family, "filter", "INPUT", ["-i", bridge, "-j", INPUT_CHAIN])
        _restore(IPV4, "raw", {RAW_CHAIN: [_RAW_RULE]})
        self._jump(IPV4, "raw", "PREROUTING", ["-j", RAW_CHAIN])

    def missing(self, bridge: str) -> list[str]:
        """The rules that are not in place (empty: all are), as ``table chain rule`` lines."""
        gaps = []
        try:
            families = self._families()
        except EgressError as exc:
            return [str(exc)]
        for family in families:
            checks = [
                ("filter", "FORWARD", ["-j", "DOCKER-USER"]),
                ("filter", "DOCKER-USER", ["-i", bridge, "-j", EGRESS_CHAIN]),
                ("filter", "DOCKER-USER", ["-o", bridge, "-j", EGRESS_CHAIN]),
                ("filter", "INPUT", ["-i", bridge, "-j", INPUT_CHAIN]),
            ]
            checks += [
                ("filter", EGRESS_CHAIN, rule)
                for rule in _egress_rules(bridge, family, self.resolvers, self.allowed)
            ]
            checks += [
                ("filter", INPUT_CHAIN, rule)
                for rule in _input_rules(bridge, family, self.resolvers)
            ]
            if family is IPV4:
                checks += [("raw", "PREROUTING", ["-j", RAW_CHAIN]), ("raw", RAW_CHAIN, _RAW_RULE)]
            for table, chain, rule in checks:
                if _run(family, ["-t", table, "-C", chain, *rule], check=False).returncode:
                    gaps.append(f"{family.tool} -t {table} {chain} {' '.join(rule)}")
        return gaps

    def _jump(self, family: Family, table: str, chain: str, rule: list[str]) -> None:
        if _run(family, ["-t", table, "-C", chain, *rule], check=False).returncode:
            _run(family, ["-t", table, "-I", chain, "1", *rule])


_RAW_RULE = ["!", "-i", "lo", "-d", "127.0.0.0/8", "-j", "DROP"]


def _restore(family: Family, table: str, chains: dict[str, list[list[str]]]) -> None:
    """Replace whole chains in one transaction: ``:CHAIN`` creates or empties each, the other
    chains of the table are left as they are (``--noflush``)."""
    lines = [f"*{table}"]
    lines += [f":{chain} - [0:0]" for chain in chains]
    for chain, rules in chains.items():
        lines += [" ".join(["-A", chain, *rule]) for rule in rules]
    lines.append("COMMIT")
    tool = f"{family.tool}-restore"
    try:
        result = subprocess.run(
            [tool, "-w", "5", "--noflush"],
            input="\n".join(lines) + "\n",
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EgressError(f"{tool} could not run: {exc}") from None
    if result.returncode:
        detail = (result.stderr or result.stdout).strip().splitlines()
        why = detail[-1] if detail else f"exit code {result.returncode}"
        hint = " (the agent must run as root)" if "ermission" in why else ""
        raise EgressError(f"{tool} failed: {why}{hint}")


def _run(
    family: Family, args: list[str], *, check: bool = True
) -> subprocess.CompletedProcess[str]:
    argv = [family.tool, "-w", "5", *args]
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EgressError(f"{family.tool} could not run: {exc}") from None
    if check and result.returncode:
        detail = (result.stderr or result.stdout).strip().splitlines()
        why = detail[-1] if detail else f"exit code {result.returncode}"
        hint = " (the agent must run as root)" if "ermission" in why else ""
        raise EgressError(f"`{' '.join(argv)}` failed: {why}{hint}")
    return result
