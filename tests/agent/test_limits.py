"""A lease's memory and CPUs are its GPUs' share of what the host keeps free for rentals."""

from __future__ import annotations

import pytest

from supplier_agent.limits import (
    GIB,
    MIN_MEMORY_BYTES,
    HostResources,
    Reserve,
    lease_limits,
    parse_reserve,
)

HOST = HostResources(memory_bytes=64 * GIB, cpus=16.0)


def test_a_lease_gets_its_gpus_share_of_the_host_after_the_reserve() -> None:
    limits = lease_limits(HOST, 2, 8, Reserve(memory_bytes=8 * GIB, cpus=2.0))

    assert limits.memory_bytes == 14 * GIB  # (64 - 8) * 2/8
    assert limits.cpus == 3.5  # (16 - 2) * 2/8


def test_every_gpu_gets_everything_but_the_reserve() -> None:
    limits = lease_limits(HOST, 8, 8, Reserve(memory_bytes=8 * GIB, cpus=2.0))

    assert (limits.memory_bytes, limits.cpus) == (56 * GIB, 14.0)


def test_the_default_reserve_keeps_a_tenth_of_memory_and_a_core() -> None:
    limits = lease_limits(HOST, 1, 1)

    assert limits.memory_bytes == 64 * GIB - int(6.4 * GIB)
    assert limits.cpus == 15.0


def test_a_small_host_still_gives_a_usable_floor() -> None:
    limits = lease_limits(HostResources(memory_bytes=2 * GIB, cpus=1.0), 1, 8)

    assert limits.memory_bytes == MIN_MEMORY_BYTES
    assert limits.cpus == 0.5


@pytest.mark.parametrize(("memory", "cpus"), [("lots", None), ("-1", None), (None, "-2")])
def test_a_bad_reserve_is_refused(memory: str | None, cpus: str | None) -> None:
    with pytest.raises(ValueError, match="reserve"):
        parse_reserve(memory, cpus)


def test_this_hosts_resources_are_read() -> None:
    host = HostResources.read()
    assert host.memory_bytes > 0
    assert host.cpus >= 1
