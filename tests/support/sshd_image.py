"""A container image that runs a real OpenSSH server, built locally (no registry is reachable):
the host's own /usr/sbin/sshd and the libraries it links, on top of the busybox test image.

Its command writes ``$PUBLIC_KEY`` (the renter's keys, as the catalogue's Ubuntu+SSH template
gets them) to root's authorized_keys and runs ``sshd -D -e`` on port 22.
"""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

SSHD_IMAGE = "cloudgpu-test/sshd:latest"
SSHD = Path("/usr/sbin/sshd")

SSHD_CONFIG = """\
Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PidFile none
"""
# Root (busybox sh) and sshd's privilege-separation user.
PASSWD = "root:x:0:0:root:/root:/bin/sh\nsshd:x:100:65534::/run/sshd:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
COMMAND = (
    'mkdir -p /root/.ssh && printf "%s\\n" "$PUBLIC_KEY" > /root/.ssh/authorized_keys && '
    "chmod 700 /root/.ssh && chmod 600 /root/.ssh/authorized_keys && exec /usr/sbin/sshd -D -e"
)


def _libraries() -> list[Path]:
    out = subprocess.run(["ldd", str(SSHD)], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        match = re.search(r"(/\S+)", line.split("=>")[-1])
        if match:
            found.append(Path(match.group(1)))
    return found


def build_sshd_image(docker_client: Any, busybox_image: str, host_key: Path) -> str:
    """Build (or rebuild) the image; ``host_key`` is an ed25519 private key for the server."""
    dockerfile = (
        f"FROM {busybox_image}\n"
        "COPY rootfs/ /\n"
        'RUN ["/bin/sh", "-c", "mkdir -p /run/sshd /var/empty /root && chmod 700 /root '
        '&& chmod 600 /etc/ssh/ssh_host_ed25519_key"]\n'
    )
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:

        def add(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            tar.addfile(info, io.BytesIO(data))

        add("Dockerfile", dockerfile.encode())
        for path in [SSHD, *_libraries()]:
            add(f"rootfs{path.resolve()}", path.resolve().read_bytes(), 0o755)
            if path.resolve() != path:  # /lib64/ld-linux... is a link: keep the name it is used by
                add(f"rootfs{path}", path.resolve().read_bytes(), 0o755)
        add("rootfs/etc/ssh/sshd_config", SSHD_CONFIG.encode())
        add("rootfs/etc/ssh/ssh_host_ed25519_key", host_key.read_bytes(), 0o600)
        add("rootfs/etc/passwd", PASSWD.encode())
        add("rootfs/etc/group", GROUP.encode())
    context.seek(0)
    docker_client.images.build(fileobj=context, custom_context=True, tag=SSHD_IMAGE, rm=True)
    return SSHD_IMAGE
