"""Several web processes behind one address (`make run --web N`): nginx from the distribution
(``nginx-light``) on the hub's port, in front of N Daphne processes on loopback ports.

Each agent socket lives on one process; the processes share nothing but Postgres and Redis
(a command reaches an agent on another process through the Redis channel layer). nginx's
``least_conn`` sends each new connection to the process holding the fewest, so a restarted
process (which lost its agents) takes most of the returning ones, and a restart of one process
moves only its own agents. nginx sets ``X-Forwarded-For`` to the address it saw (never the
client's own header, which is the client's to forge) and Daphne runs with ``--proxy-headers``,
so the rate limits and the installer's records keep seeing the client's address.
Django-free, like the rest of ``hub.lib``.
"""

from __future__ import annotations

import os
import pwd
import shutil
from dataclasses import dataclass
from pathlib import Path

# WebSocket and long-poll connections stay open for hours; a heartbeat every 15 s keeps the
# agents' busy anyway. The live dashboard's socket may be quiet longer.
PROXY_TIMEOUT_S = 3600


class ProxyUnavailable(Exception):
    """nginx is not installed; the message says what to install."""


@dataclass(frozen=True)
class WebProxy:
    folder: Path
    listen_host: str
    listen_port: int
    upstream_ports: tuple[int, ...]

    def config(self) -> str:
        # max_fails=0: nginx's default marks a process that refused one connection (it was
        # starting or restarting) unusable for 10 s, and least_conn then hands every agent that
        # returns meanwhile to the others; a refused loopback connect costs nothing, so keep
        # trying it (proxy_next_upstream moves on) and the restarted process fills up again.
        servers = "\n".join(
            f"        server 127.0.0.1:{port} max_fails=0;" for port in self.upstream_ports
        )
        folder = self.folder
        return f"""# Written by `hub.runner serve --web N`; edits are overwritten on start.
worker_processes 1;
daemon off;
pid {folder / "nginx.pid"};
error_log stderr warn;

events {{
    worker_connections 65536;
}}

http {{
    access_log off;
    client_body_temp_path {folder / "tmp" / "body"};
    proxy_temp_path {folder / "tmp" / "proxy"};
    fastcgi_temp_path {folder / "tmp" / "fastcgi"};
    uwsgi_temp_path {folder / "tmp" / "uwsgi"};
    scgi_temp_path {folder / "tmp" / "scgi"};
    server_tokens off;
    client_max_body_size 64m;

    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      "";
    }}

    upstream cloudgpu_web {{
        least_conn;
{servers}
    }}

    server {{
        listen {_listen(self.listen_host, self.listen_port)};
        location / {{
            proxy_pass http://cloudgpu_web;
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header Host $http_host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_read_timeout {PROXY_TIMEOUT_S}s;
            proxy_send_timeout {PROXY_TIMEOUT_S}s;
            proxy_buffering off;
            # A process that is restarting refuses the connection: the next one gets it.
            proxy_next_upstream error timeout;
        }}
    }}
}}
"""

    def write(self) -> Path:
        """The configuration and the folders nginx writes to; returns the file."""
        tmp = self.folder / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            # nginx's workers (nobody when the master is root) create and write the temp
            # folders (large request bodies) under tmp/.
            nobody = pwd.getpwnam("nobody")
            os.chown(tmp, nobody.pw_uid, nobody.pw_gid)
        path = self.folder / "nginx.conf"
        path.write_text(self.config())
        return path

    def argv(self) -> list[str]:
        # -e: not the built-in /var/log/nginx/error.log, which only root may open.
        return ["nginx", "-e", "stderr", "-c", str(self.folder / "nginx.conf")]


def _listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def plan(folder: Path, listen_host: str, listen_port: int, processes: int) -> WebProxy:
    """nginx on ``listen_port`` in front of ``processes`` Daphne processes on the ports right
    after it; ProxyUnavailable (saying what to install) where nginx is missing."""
    if processes < 2:
        raise ValueError("a proxy is for two web processes or more")
    if shutil.which("nginx") is None:
        raise ProxyUnavailable(
            "--web N needs nginx in front of the web processes: apt install nginx-light"
        )
    ports = tuple(listen_port + 1 + n for n in range(processes))
    return WebProxy(folder, listen_host, listen_port, ports)
