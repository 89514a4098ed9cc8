"""Which destinations the rentals' egress filter drops: every entry of IANA's IPv4 and IPv6
special-purpose address registries that is not globally reachable, and multicast; the
supplier's allow-list and the globally reachable blocks inside a dropped range pass first.

The rules themselves, on real iptables and a LAN neighbour, are in
tests/e2e/test_hostile_tenant.py.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import pytest

from supplier_agent.egress import (
    BLOCKED_V4,
    BLOCKED_V6,
    GLOBAL_EXCEPTIONS_V6,
    IPV4,
    IPV6,
    Family,
    _egress_rules,
)

BRIDGE = "br-lease"

# One address from each registry entry (and from the smaller entries inside one), so a range
# left out of the lists, or an exception that swallows a dropped one, fails by name.
DROPPED = [
    ("0.0.0.0", "this host on this network"),  # noqa: S104 - a destination, not a bind
    ("0.1.2.3", "this network"),
    ("10.1.2.3", "private-use"),
    ("100.64.0.1", "shared address space (CGNAT)"),
    ("100.127.255.254", "shared address space, last"),
    ("127.0.0.1", "loopback"),
    ("169.254.169.254", "link-local: cloud metadata"),
    ("172.16.0.1", "private-use"),
    ("172.31.255.254", "private-use, last"),
    ("192.0.0.1", "IETF protocol assignments: DS-Lite"),
    ("192.0.0.8", "IPv4 dummy address"),
    ("192.0.0.9", "PCP anycast: globally reachable, dropped on purpose (egress.py)"),
    ("192.0.0.10", "TURN anycast: globally reachable, dropped on purpose (egress.py)"),
    ("192.0.0.170", "NAT64/DNS64 discovery"),
    ("192.0.0.255", "IETF protocol assignments, last"),
    ("192.0.2.1", "documentation (TEST-NET-1)"),
    ("192.88.99.1", "deprecated 6to4 relay anycast"),
    ("192.168.1.1", "private-use"),
    ("198.18.0.1", "benchmarking"),
    ("198.19.255.254", "benchmarking, last"),
    ("198.51.100.2", "documentation (TEST-NET-2): issue 33"),
    ("203.0.113.1", "documentation (TEST-NET-3)"),
    ("224.0.0.251", "multicast: mDNS"),
    ("239.255.255.250", "multicast: SSDP (UPnP)"),
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "limited broadcast"),
    ("::", "unspecified"),
    ("::1", "loopback"),
    ("::ffff:192.168.1.1", "IPv4-mapped"),
    ("64:ff9b:1::a00:1", "local-use IPv4/IPv6 translation"),
    ("100::1", "discard-only"),
    ("100:0:0:1::1", "dummy IPv6 prefix"),
    ("2001::1", "TEREDO"),
    ("2001:1::1", "PCP anycast: globally reachable, dropped on purpose (egress.py)"),
    ("2001:1::2", "TURN anycast: globally reachable, dropped on purpose (egress.py)"),
    ("2001:1::3", "DNS-SD SRP anycast: globally reachable, dropped on purpose (egress.py)"),
    ("2001:2::1", "benchmarking"),
    ("2001:10::1", "deprecated ORCHID"),
    ("2001:1ff:ffff::1", "IETF protocol assignments, last /32"),
    ("2001:db8::1", "documentation"),
    ("2002:c0a8:101::1", "6to4 (192.168.1.1 inside)"),
    ("3fff::1", "documentation"),
    ("5f00::1", "segment routing (SRv6) SIDs"),
    ("fc00::1", "unique local"),
    ("fd12:3456::1", "unique local"),
    ("fe80::1", "link-local"),
    ("fec0::1", "deprecated site-local"),
    ("ff02::1", "multicast: all nodes"),
]

PASSED = [
    ("1.1.1.1", "public"),
    ("8.8.8.8", "public"),
    ("11.0.0.1", "public, just past 10/8"),
    ("100.128.0.1", "public, just past CGNAT"),
    ("172.32.0.1", "public, just past 172.16/12"),
    ("192.31.196.1", "AS112-v4"),
    ("192.52.193.1", "AMT"),
    ("192.175.48.1", "direct delegation AS112 service"),
    ("198.20.0.1", "public, just past benchmarking"),
    ("223.255.255.254", "public, last before multicast"),
    ("2606:4700::1111", "public"),
    ("2001:4860:4860::8888", "public"),
    ("2001:200::1", "public, just past 2001::/23"),
    ("64:ff9b::808:808", "NAT64 well-known prefix (8.8.8.8 inside)"),
    ("2001:3::1", "AMT: globally reachable inside 2001::/23"),
    ("2001:4:112::1", "AS112-v6: globally reachable inside 2001::/23"),
    ("2001:20::1", "ORCHIDv2: globally reachable inside 2001::/23"),
    ("2001:30::1", "DRIP DETs: globally reachable inside 2001::/23"),
    ("2620:4f:8000::1", "direct delegation AS112 service"),
]

# Blocked networks that the running Python's ipaddress still calls global, and why; the others
# must agree with it. Its lists trail the registry: 192.0.0.0/24, 64:ff9b:1::/48 and 2002::/16
# came with the fix for CVE-2024-4032 (3.12.4, 3.13), the newest entries later or not yet.
IPADDRESS_DIFFERS = {
    "192.0.0.0/24": "only parts of it before CVE-2024-4032's fix",
    "192.88.99.0/24": "deprecated: the registry says N/A, ipaddress global",
    "224.0.0.0/4": "multicast: ipaddress keeps it apart (is_multicast)",
    "64:ff9b:1::/48": "not before CVE-2024-4032's fix",
    "100:0:0:1::/64": "RFC 9780 (2025)",
    "2002::/16": "not before CVE-2024-4032's fix",
    "3fff::/20": "RFC 9637 (2024)",
    "5f00::/16": "RFC 9602 (2024)",
    "fec0::/10": "deprecated site-local: ipaddress keeps it apart (is_site_local)",
    "ff00::/8": "multicast: ipaddress keeps it apart (is_multicast)",
}


def _family(address: str) -> Family:
    return IPV4 if ipaddress.ip_address(address).version == 4 else IPV6


def _fate(address: str, allowed: Sequence[str] = ()) -> str:
    """What CLOUDGPU-EGRESS does with a new connection from the lease bridge to ``address``:
    the target of the first rule that matches, as the kernel walks the chain."""
    destination = ipaddress.ip_address(address)
    for rule in _egress_rules(BRIDGE, _family(address), (), allowed):
        if "--ctstate" in rule or "-o" in rule:  # answers, and traffic into the bridge
            continue
        if "-d" in rule and destination not in ipaddress.ip_network(rule[rule.index("-d") + 1]):
            continue
        return rule[-1]
    raise AssertionError("the chain has no final rule")


def _networks(ranges: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(network) for network in ranges]


@pytest.mark.parametrize(("address", "what"), DROPPED)
def test_every_non_global_registry_entry_is_dropped(address: str, what: str) -> None:
    destination = ipaddress.ip_address(address)
    family = _family(address)

    assert any(destination in network for network in _networks(family.blocked)), what
    assert not any(destination in network for network in _networks(family.exceptions)), what
    assert _fate(address) == "DROP", what


@pytest.mark.parametrize(("address", "what"), PASSED)
def test_public_and_globally_reachable_addresses_pass(address: str, what: str) -> None:
    assert _fate(address) == "RETURN", what


def test_the_globally_reachable_exceptions_lie_inside_a_dropped_range() -> None:
    blocked = [ipaddress.IPv6Network(network) for network in BLOCKED_V6]
    for exception in map(ipaddress.IPv6Network, GLOBAL_EXCEPTIONS_V6):
        assert any(exception.subnet_of(network) for network in blocked), exception


@pytest.mark.parametrize("network", BLOCKED_V4 + BLOCKED_V6)
def test_python_ipaddress_agrees_that_no_blocked_network_is_global(network: str) -> None:
    parsed = ipaddress.ip_network(network)
    ends = parsed[0], parsed[-1]
    if network in IPADDRESS_DIFFERS:
        # Still a range ipaddress knows as special where it has a word for it.
        if "multicast" in IPADDRESS_DIFFERS[network]:
            assert all(end.is_multicast for end in ends)
        return
    assert not any(end.is_global for end in ends)


def test_the_allow_list_passes_a_range_of_a_dropped_one() -> None:
    allowed = ("192.168.1.0/24", "fd12:3456::/64")

    assert _fate("192.168.1.20", allowed) == "RETURN"
    assert _fate("fd12:3456::20", allowed) == "RETURN"
    assert _fate("192.168.2.20", allowed) == "DROP"
    assert _fate("fd12:3457::20", allowed) == "DROP"


@pytest.mark.parametrize("family", [IPV4, IPV6], ids=["ipv4", "ipv6"])
def test_the_allow_list_and_the_exceptions_come_before_the_drops(family: Family) -> None:
    allowed = ("10.1.2.0/24", "fd12:3456::/64")
    rules = _egress_rules(BRIDGE, family, (), allowed)
    by_destination = [(rule[rule.index("-d") + 1], rule[-1]) for rule in rules if "-d" in rule]
    first_drop = next(i for i, (_, target) in enumerate(by_destination) if target == "DROP")

    passed_first = {network for network, _ in by_destination[:first_drop]}
    own_allowed = {n for n in allowed if ipaddress.ip_network(n).version == family.version}
    assert passed_first == own_allowed | set(family.exceptions)
    assert all(target == "RETURN" for _, target in by_destination[:first_drop])
    assert by_destination[first_drop:] == [(network, "DROP") for network in family.blocked]
    assert rules[-1] == ["-j", "RETURN"]  # everything else: the internet
