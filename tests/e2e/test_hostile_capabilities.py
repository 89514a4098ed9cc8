"""Issue 33 item 5: a rental's root holds only the capabilities ordinary images need.

Measured inside real containers made by the agent's ContainerRuntime: the effective set is
exactly RENTAL_CAPS; what entrypoints and package managers do as root still works (ownership,
files of other users, switching user, signalling another user's process, ports below 1024 as
any user, chroot); what lets a tenant attack the host or its neighbours does not (raw sockets,
device nodes, file capabilities). sshd's logins with these capabilities are in
tests/e2e/test_renter_ssh.py (a real OpenSSH server with privilege separation).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from supplier_agent.containers import RENTAL_CAPS, ContainerRuntime
from supplier_agent.protocol import DockerRun

pytestmark = pytest.mark.docker

# Bit numbers from linux/capability.h.
CAP_BITS = {
    "CHOWN": 0,
    "DAC_OVERRIDE": 1,
    "DAC_READ_SEARCH": 2,
    "FOWNER": 3,
    "FSETID": 4,
    "KILL": 5,
    "SETGID": 6,
    "SETUID": 7,
    "SETPCAP": 8,
    "NET_BIND_SERVICE": 10,
    "NET_RAW": 13,
    "SYS_CHROOT": 18,
    "MKNOD": 27,
    "AUDIT_WRITE": 29,
    "SETFCAP": 31,
}


@pytest.fixture
def rental(docker_client: Any, busybox_image: str) -> Iterator[Any]:
    """A running rental of the busybox image, as root, made the way the agent makes one."""
    agent_id = str(uuid.uuid4())
    runtime = ContainerRuntime(
        docker_client, gpu_devices="none", stop_grace_s=1, allow_local_images=True
    )
    spec = DockerRun(
        command_id=str(uuid.uuid4()),
        lease_id=str(uuid.uuid4()),
        epoch=1,
        image=busybox_image,
        command=("sleep", "600"),
    )
    result = runtime.run(spec, [0], agent_id=agent_id, ready_timeout_s=30)
    try:
        yield docker_client.containers.get(result.container_id)
    finally:
        runtime.remove(spec.lease_id)


def _sh(container: Any, script: str, user: str = "0:0") -> tuple[int, str]:
    code, output = container.exec_run(["sh", "-c", script], user=user)
    return code, output.decode(errors="replace").strip()


def test_the_effective_set_is_exactly_the_rental_capabilities(rental: Any) -> None:
    code, status = _sh(rental, "grep -E '^Cap(Eff|Bnd):' /proc/self/status")
    assert code == 0, status
    masks = {line.split(":")[0]: int(line.split()[1], 16) for line in status.splitlines()}
    expected = sum(1 << CAP_BITS[name] for name in RENTAL_CAPS)
    assert masks["CapEff"] == expected, hex(masks["CapEff"])
    # Nor can a process regain more later: the bounding set is the same.
    assert masks["CapBnd"] == expected, hex(masks["CapBnd"])


# The image has no /tmp and no other user: each script makes what it needs.
SETUP = (
    "mkdir -p /tmp && grep -q '^u:' /etc/passwd || "
    "{ echo 'u:x:1000:1000::/tmp:/bin/sh' >> /etc/passwd; echo 'u:x:1000:' >> /etc/group; }; "
)
# Started as the user, found by polling (bounded), then signalled by root.
SIGNAL_OTHER_USER = (
    'su u -c "sleep 300" & i=0; '
    "until pid=$(pidof sleep); do i=$((i+1)); [ $i -lt 100000 ] || exit 9; done; kill $pid"
)


@pytest.mark.parametrize(
    ("what", "script", "user"),
    [
        ("chown a file", "touch /tmp/f && chown 1000:1000 /tmp/f", "0:0"),
        (
            "write another user's private file",
            "echo x > /tmp/p && chown 1000 /tmp/p && chmod 600 /tmp/p && echo y >> /tmp/p",
            "0:0",
        ),
        (
            "change another user's file mode",
            "touch /tmp/m && chown 1000 /tmp/m && chmod 644 /tmp/m",
            "0:0",
        ),
        ("switch to another user (gosu, su, apt's _apt)", 'su u -c "id -u" | grep -qx 1000', "0:0"),
        ("signal another user's process (a root supervisor)", SIGNAL_OTHER_USER, "0:0"),
        ("chroot (sshd's pre-auth sandbox)", "chroot / true", "0:0"),
        # nc listening until timeout ends it (143), where a refused bind exits 1.
        ("bind port 80 as a user", "timeout 1 nc -l -p 80; test $? -ne 1", "1000:1000"),
    ],
)
def test_what_ordinary_images_do_as_root_still_works(
    rental: Any, what: str, script: str, user: str
) -> None:
    assert _sh(rental, SETUP)[0] == 0
    code, output = _sh(rental, script, user)
    assert code == 0, f"{what}: {output}"


@pytest.mark.parametrize(
    ("what", "script"),
    [
        # A packet socket is what ARP spoofing of the bridge's neighbours needs.
        ("open a packet socket (ARP spoofing)", "arping -c 1 -w 1 -I eth0 192.0.2.1"),
        ("make a device node", "mknod /tmp/sda b 8 0"),
        ("give a file capabilities", "touch /tmp/c && setcap cap_net_raw+ep /tmp/c"),
    ],
)
def test_what_attacks_the_host_or_neighbours_is_refused(
    rental: Any, what: str, script: str
) -> None:
    assert _sh(rental, SETUP)[0] == 0
    code, output = _sh(rental, script)
    assert code != 0, f"{what} succeeded: {output}"
    if "setcap" not in script:  # busybox has no setcap: refused either way, said differently
        assert "not permitted" in output, f"{what}: {output}"
