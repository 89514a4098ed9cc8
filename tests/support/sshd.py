"""A real OpenSSH ``sshd`` on a free loopback port, playing the tunnel gateway in tests.

``Sshd(extra_config)`` writes its own config in a private folder and runs
``/usr/sbin/sshd -D -e -f CONFIG``; ``authorized_keys`` lines (``restrict,port-forwarding,
permitlisten="127.0.0.1:PORT" <key>``) decide which key may listen where. Needs root (sshd
switches to the login user) and the ``cloudgpu-tunnel`` system user: see ``ensure_tunnel_user``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import psutil
import pytest

from tests.support.polling import wait_for

SSHD = Path("/usr/sbin/sshd")
TUNNEL_USER = "cloudgpu-tunnel"
RENTER_USER = "cloudgpu-ssh"  # renters' login on the gateway (hub/tunnels/renter_ssh.py)


def free_port() -> int:
    """A loopback TCP port nobody listens on right now (a race, so callers retry on clash)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def require_sshd() -> None:
    """Skip the calling test where a real gateway cannot run."""
    if os.geteuid() != 0:
        pytest.skip("a real sshd gateway needs root (it switches to the tunnel user)")
    for tool in (str(SSHD), "ssh", "ssh-keygen", "useradd"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt install openssh-server openssh-client)")


def ensure_tunnel_user(name: str = TUNNEL_USER) -> None:
    """The gateway's login user, made once per machine (several test runs may race here)."""

    def exists() -> bool:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                capture_output=True,
                check=False,  # another run may have made it meanwhile, or hold passwd's lock
                timeout=30,
            )
            return False
        return True

    wait_for(exists, timeout_s=30, interval_s=0.2, what=f"the system user {name}")

    # useradd leaves the account "locked" ('!' in /etc/shadow) and sshd without PAM refuses a
    # locked account even for key logins; '*' keeps it password-less but usable with keys.
    # (PAM is off in these tests: pam_loginuid fails in many containers.)
    # Polled, not once: another xdist worker's useradd or usermod may hold passwd's lock.
    def unlocked() -> bool:
        shadow = Path("/etc/shadow").read_text().splitlines()
        entry = next((line.split(":") for line in shadow if line.startswith(f"{name}:")), None)
        if entry is None or not entry[1].startswith("!"):
            return True
        subprocess.run(["usermod", "-p", "*", name], check=False, capture_output=True, timeout=30)
        return False

    wait_for(unlocked, timeout_s=30, interval_s=0.2, what=f"the system user {name} unlocked")


def _private_dir(prefix: str) -> Path:
    # Not pytest's tmp_path: sshd reads authorized_keys as the tunnel user after dropping root,
    # so the folder must be traversable (0711: enter, not list).
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/run"))
    folder.chmod(0o711)
    return folder


def generate_key(path: Path, comment: str = "cloudgpu-test") -> str:
    """An ed25519 key pair at ``path``; returns the public key line."""
    subprocess.run(
        ["ssh-keygen", "-t", "ed25519", "-N", "", "-q", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
    )
    return path.with_name(path.name + ".pub").read_text().strip()


@functools.cache
def session_host_key() -> Path:
    """One gateway host key per test session, shared by every ``Sshd`` that takes no other."""
    folder = _private_dir("cloudgpu-sshd-hostkey-")
    atexit.register(shutil.rmtree, folder, True)
    generate_key(folder / "ssh_host_ed25519_key", "cloudgpu-test-gateway")
    return folder / "ssh_host_ed25519_key"


class Sshd:
    """A running sshd. ``extra_config`` goes first (sshd keeps the first value of a keyword, so
    it overrides the defaults below); its ``Match`` blocks, if any, go last."""

    def __init__(
        self,
        extra_config: str = "",
        *,
        authorized_keys: str = "",
        host_key: Path | None = None,
    ) -> None:
        require_sshd()
        ensure_tunnel_user()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
        self.dir = _private_dir("cloudgpu-sshd-")
        self.host_key = host_key or session_host_key()
        self.host_public_key = (
            self.host_key.with_name(self.host_key.name + ".pub").read_text().strip()
        )
        self.authorized_keys = self.dir / "authorized_keys"
        self.write_authorized_keys(authorized_keys)
        self.log = self.dir / "sshd.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        try:
            self._start(extra_config)
        except BaseException:
            self.stop()
            raise

    def __enter__(self) -> Sshd:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def config_text(self, extra_config: str, port: int) -> str:
        lines = extra_config.strip().splitlines()
        first_match = next(
            (i for i, line in enumerate(lines) if line.strip().lower().startswith("match ")),
            len(lines),
        )
        base = f"""
Port {port}
ListenAddress 127.0.0.1
HostKey {self.host_key}
PidFile {self.dir}/sshd.pid
StrictModes no
UsePAM no
AuthorizedKeysFile {self.authorized_keys}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding remote
PermitOpen none
DisableForwarding no
GatewayPorts no
PermitTTY no
X11Forwarding no
AllowAgentForwarding no
AllowUsers {TUNNEL_USER}
LogLevel VERBOSE
"""
        return "\n".join([*lines[:first_match], base, *lines[first_match:]]) + "\n"

    def _start(self, extra_config: str) -> None:
        for _ in range(5):  # a free port can be taken before sshd binds it
            self.port = free_port()
            config = self.dir / "sshd_config"
            config.write_text(self.config_text(extra_config, self.port))
            with open(self.log, "ab") as log:
                self.process = subprocess.Popen(
                    [str(SSHD), "-D", "-e", "-f", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            process = self.process
            wait_for(
                lambda p=process: p.poll() is not None or "Server listening on" in self.log_text(),
                timeout_s=30,
                what="sshd to listen",
            )
            if process.poll() is None:
                return
        raise AssertionError(f"sshd did not start:\n{self.log_text()}")

    def write_authorized_keys(self, text: str) -> None:
        """Replace authorized_keys; sshd reads it at each login, so it applies at once."""
        tmp = self.authorized_keys.with_suffix(".tmp")
        tmp.write_text(text if not text or text.endswith("\n") else text + "\n")
        tmp.chmod(0o644)  # read by the tunnel user
        tmp.replace(self.authorized_keys)

    def allow(self, public_key: str, *listen_ports: int) -> None:
        """Let ``public_key`` listen on these gateway ports (the hub's rule, as a file)."""
        permits = ",".join(f'permitlisten="127.0.0.1:{port}"' for port in listen_ports)
        line = f"restrict,port-forwarding,{permits} {public_key}\n"
        current = self.authorized_keys.read_text() if self.authorized_keys.exists() else ""
        self.write_authorized_keys(current + line)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        """Stop sshd and its per-connection children (they run in sessions of their own)."""
        if self.process is not None and self.process.poll() is None:
            children: list[psutil.Process] = []
            with contextlib.suppress(psutil.NoSuchProcess):
                children = psutil.Process(self.process.pid).children(recursive=True)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            for child in children:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
