"""``configure --driver`` and ``--connect-mode``: the seed's names for how rentals start and
who dials whom, and what this agent does with each.

A driver this agent cannot run is refused, never swapped for another: a host configured for
nerdctl that quietly ran Docker would rent out what its supplier did not set up. So deployments
stay off (nothing is written) and the message says which drivers exist.
"""

from __future__ import annotations

from supplier_agent.config import RUNTIMES, ConfigError

# Other agents' drivers, and why this one has none of them.
UNSUPPORTED_DRIVERS = {
    "nerdctl": "containerd through nerdctl is not supported yet",
    "udocker": "rootless udocker is not supported: rentals need Docker's GPU and network isolation",
    "host": "host processes (macOS, Metal) are not supported: rentals run in containers only",
    "none": "a host without a driver takes no rentals",
}
CONNECT_MODES = ("agent_dial", "server_dial")


def runtime_for_driver(driver: str) -> str:
    """The runtime a driver name means here, or why deployments stay off."""
    if driver in RUNTIMES:
        return driver
    why = UNSUPPORTED_DRIVERS.get(driver, f"unknown driver {driver!r}")
    raise ConfigError(
        f"--driver {driver}: {why}; deployments stay off rather than guess another driver, "
        f"nothing written (drivers: {', '.join(RUNTIMES)})"
    )


def check_connect_mode(mode: str) -> None:
    if mode == "server_dial":
        raise ConfigError(
            "--connect-mode server_dial: the hub never dials suppliers (no inbound port on "
            "this host); agents connect out, --connect-mode agent_dial, nothing written"
        )
