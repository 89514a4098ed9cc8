from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the caller binds it right away)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers bind (Postgres and Redis do): connections in TIME_WAIT left by the last
        # run do not make a port taken, only a listener does. Without it a restarted embedded
        # Postgres moved to another port, away from the URL its clients hold.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_port(port: int, host: str = "127.0.0.1", timeout_s: float = 30.0) -> bool:
    """Poll until something accepts connections on host:port, or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            time.sleep(0.1)
    return False
