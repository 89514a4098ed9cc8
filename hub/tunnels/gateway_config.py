"""The tunnel gateway's configuration: sshd (which keys may forward which ports is the hub's
answer, per login) and nginx (which port a host name maps to is the hub's answer, per request).

Pure rendering, no Django: the gateway runs beside the hub, not inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

# Responses are never cut before this; idle WebSockets and long streams (token streaming,
# notebooks' kernels) live within it.
DEFAULT_TIMEOUT_S = 900
# The least the edge may be set to (TUNNEL_EDGE_TIMEOUT_S; the hub's settings and the gateway
# refuse less): a long generation may stay silent for ten minutes before its first byte.
TIMEOUT_FLOOR_S = 620
# How long the edge reuses the hub's "host -> port" answer: an ended lease's URL may route for
# this long after its end (to a port that no new lease gets for an hour: TUNNEL_PORT_QUARANTINE_S).
ROUTE_CACHE_S = 2
# How long nginx keeps an answer no one asked for: it is stale after ROUTE_CACHE_S anyway.
ROUTE_CACHE_INACTIVE_S = 2 * ROUTE_CACHE_S
# Headers from the edge to the hub's page: why the edge asks for it, and its limit.
EDGE_ERROR_HEADER = "X-CloudGPU-Edge-Error"
EDGE_TIMEOUT_HEADER = "X-CloudGPU-Edge-Timeout"


@dataclass(frozen=True)
class GatewayOptions:
    folder: Path
    hub_url: str  # how the gateway reaches the hub, e.g. http://web:8000
    ssh_host: str = "0.0.0.0"  # noqa: S104 - the gateway's whole point is to be reachable
    ssh_port: int = 2222
    http_host: str = "0.0.0.0"  # noqa: S104
    http_port: int = 8080
    user: str = "cloudgpu-tunnel"
    # Renters' login (ssh -J / -L to their own rentals' ports); empty: no renter logins.
    renter_user: str = "cloudgpu-ssh"
    # Below the hub's TUNNEL_PORT_QUARANTINE_S (see gateway.run): a renter's login may reach
    # only ports that are still theirs.
    renter_max_connection_s: int = 3300
    keys_command_user: str = "nobody"
    # Run by a user other than root (the local trial's): sshd logs in only that user, so
    # agents log in as it and renters' SSH is off (renter_user ""); see keys_command_line.
    unprivileged: bool = False
    timeout_s: int = DEFAULT_TIMEOUT_S
    tls_cert: Path | None = None
    tls_key: Path | None = None
    python: str = "/usr/bin/python3"
    nginx_workers: str = "auto"

    @property
    def host_key(self) -> Path:
        return self.folder / "ssh_host_ed25519_key"

    @property
    def keys_command(self) -> Path:
        return self.folder / "authorized-keys"

    @property
    def route_cache_socket(self) -> Path:
        return self.folder / "tmp" / "routes.sock"


def _renter_block(user: str) -> str:
    """The renters' login: local forwards (-L, -W, ProxyJump) to gateway loopback ports only,
    and of those only the ones the hub's answer names (its permitopen); everything else off,
    here as well as in that answer, so neither alone can open a shell or a -R listener."""
    return f"""
# Renters: direct-tcpip only, to 127.0.0.1 ports that the hub's answer permits (permitopen);
# no -R (AllowTcpForwarding local, PermitListen none), no sessions (MaxSessions 0, and a
# ForceCommand that refuses), no TTY, no agent/X11/socket forwarding, no tun devices.
Match User {user}
    AllowTcpForwarding local
    PermitOpen 127.0.0.1:*
    PermitListen none
    GatewayPorts no
    AllowStreamLocalForwarding no
    AllowAgentForwarding no
    X11Forwarding no
    PermitTunnel no
    PermitTTY no
    MaxSessions 0
    ForceCommand /usr/sbin/nologin
"""


def render_sshd_config(options: GatewayOptions) -> str:
    users = " ".join(u for u in (options.user, options.renter_user) if u)
    renter_block = _renter_block(options.renter_user) if options.renter_user else ""
    return f"""# Written by `python -m hub.tunnels.gateway`; edits are overwritten on start.
# sshd runs as `sshd -i` per connection (hub/tunnels/ssh_listener.py accepts on
# {options.ssh_host}:{options.ssh_port}), so Port, ListenAddress and MaxStartups do not apply.
HostKey {options.host_key}
LogLevel VERBOSE
UsePAM no
UseDNS no
PrintMotd no
PermitRootLogin no
AllowUsers {users}
# Keys are the hub's answer per login: a lease's key gets restrict,port-forwarding and
# permitlisten for its own ports only; a renter's key permitopen for their running leases'
# ports only (hub/tunnels/renter_ssh.py); an unknown or finished lease's key gets nothing.
AuthorizedKeysFile none
AuthorizedKeysCommand {keys_command_line(options)} %u %t %k
AuthorizedKeysCommandUser {options.keys_command_user}
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
# Agents: remote forwards (-R) only, bound to loopback: no -L, no sockets, no tunnels, no
# sessions. (Renters' rules are the Match block at the end.)
AllowTcpForwarding remote
PermitOpen none
GatewayPorts no
AllowStreamLocalForwarding no
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
PermitTTY no
PermitUserRC no
PermitUserEnvironment no
MaxSessions 0
ForceCommand /usr/sbin/nologin
# Dead agents' forwards go away within a minute and free their port for the same lease.
ClientAliveInterval 15
ClientAliveCountMax 3
LoginGraceTime 20
{renter_block}"""


def _listen(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _hub_headers(secret: str, netloc: str, forwarded_for: str, scheme: str) -> str:
    return f"""        proxy_set_header Host {netloc};
        proxy_set_header X-CloudGPU-Gateway-Secret "{secret}";
        proxy_set_header X-CloudGPU-Tunnel-Host $host;
        proxy_set_header X-Forwarded-For {forwarded_for};
        proxy_set_header X-Forwarded-Proto {scheme};
        proxy_set_header Connection "";"""


def _page_location(name: str, hub_headers: str, error: str, timeout_s: int) -> str:
    # The edge's own header, never the client's: a renter cannot pick the page.
    return f"""        location {name} {{
            rewrite ^ /internal/tunnels/edge/page break;
            proxy_pass http://cloudgpu_hub;
            proxy_method GET;
            proxy_http_version 1.1;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header {EDGE_ERROR_HEADER} "{error}";
            proxy_set_header {EDGE_TIMEOUT_HEADER} "{timeout_s}";
{hub_headers}
        }}"""


def render_nginx_config(options: GatewayOptions, secret: str) -> str:
    folder = options.folder
    hub = urlsplit(options.hub_url)
    if hub.scheme not in {"http", "https"} or not hub.netloc:
        raise ValueError(f"the hub URL must look like http://web:8000, not {options.hub_url!r}")
    tls = options.tls_cert is not None and options.tls_key is not None
    listen = _listen(options.http_host, options.http_port) + (" ssl" if tls else "")
    scheme = "https" if tls else "$scheme"
    tls_lines = (
        f"    ssl_certificate {options.tls_cert};\n"
        f"    ssl_certificate_key {options.tls_key};\n"
        "    ssl_protocols TLSv1.2 TLSv1.3;\n"
        if tls
        else ""
    )
    hub_headers = _hub_headers(secret, hub.netloc, "$remote_addr", scheme)
    # The route cache's server hears the edge, not the client: the client's address and scheme
    # come in the edge's headers.
    cache_hub_headers = _hub_headers(
        secret, hub.netloc, "$http_x_forwarded_for", "$http_x_forwarded_proto"
    )
    timeout = f"{options.timeout_s}s"
    # Everything that decides the answer: the host name and every place a token may be.
    cache_key = "$host|$http_authorization|$http_x_cloudgpu_access|$cookie_cloudgpu_access"
    socket = options.route_cache_socket
    return f"""# Written by `python -m hub.tunnels.gateway`; edits are overwritten on start.
worker_processes {options.nginx_workers};
daemon off;
pid {folder / "nginx.pid"};
error_log stderr warn;

events {{
    worker_connections 8192;
}}

http {{
    # Paths only, never query strings: a renter's app may put secrets in its URLs. The path is
    # the renter's request line's ($uri becomes the hub page's when the edge shows one).
    map $request_uri $edge_path {{
        "~^(?<edge_req_path>[^?]*)" $edge_req_path;
    }}
    log_format edge '$remote_addr [$time_local] "$request_method $host$edge_path" $status '
                    '$body_bytes_sent $request_time';
    access_log {folder / "logs" / "access.log"} edge;
    client_body_temp_path {folder / "tmp" / "body"};
    proxy_temp_path {folder / "tmp" / "proxy"};
    fastcgi_temp_path {folder / "tmp" / "fastcgi"};
    uwsgi_temp_path {folder / "tmp" / "uwsgi"};
    scgi_temp_path {folder / "tmp" / "scgi"};
    server_tokens off;
    server_names_hash_bucket_size 128;

    # The hub's route answers, kept {ROUTE_CACHE_S} s per host name and credentials: a page
    # loading 50 assets asks the hub once. Only "yes, port N" is kept; refusals never are.
    proxy_cache_path {folder / "tmp" / "routes"} levels=1:2 keys_zone=cloudgpu_routes:10m
                     max_size=64m inactive={ROUTE_CACHE_INACTIVE_S}s use_temp_path=off;

    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      "";
    }}

    upstream cloudgpu_hub {{
        server {hub.netloc};
        keepalive 32;
    }}

    upstream cloudgpu_route_cache {{
        server unix:{socket};
        keepalive 32;
    }}

    # The route cache, as a server of its own on a socket only nginx uses. A cached answer read
    # by a request's auth_request stays locked until that request ends, and nginx's cache
    # manager logs "[alert] ignore long locked inactive cache entry" every inactive period for
    # each one a long stream or WebSocket holds; here each lookup is a short request of its own.
    server {{
        listen unix:{socket};
        access_log off;

        location = /__cloudgpu/auth {{
            proxy_pass http://cloudgpu_hub/internal/tunnels/edge/auth;
            proxy_http_version 1.1;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_cache cloudgpu_routes;
            proxy_cache_key "{cache_key}";
            proxy_cache_valid 204 {ROUTE_CACHE_S}s;
            proxy_cache_lock on;
            proxy_ignore_headers Cache-Control Expires Set-Cookie Vary;
{cache_hub_headers}
        }}
    }}

    server {{
        listen {listen} default_server;
        server_name _;
{tls_lines}        # The renter's service decides what it accepts (uploads of model weights, say).
        client_max_body_size 0;

        # The hub's answer for this host name (through the route cache): 204 and the gateway
        # port, or 403 (page below).
        location = /__cloudgpu/auth {{
            internal;
            proxy_pass http://cloudgpu_route_cache;
            proxy_http_version 1.1;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto {scheme};
            proxy_set_header Connection "";
        }}

        # A protected URL's token form; the hub sets the access cookie for this host.
        location = /__cloudgpu/access {{
            proxy_pass http://cloudgpu_hub/internal/tunnels/edge/access;
            proxy_http_version 1.1;
{hub_headers}
        }}

        # Unknown id (404), token needed (401), tunnel down or service not answering (502).
{_page_location("@cloudgpu_page", hub_headers, "", options.timeout_s)}

        # The service took the request but sent nothing for longer than the limit (504).
{_page_location("@cloudgpu_quiet", hub_headers, "quiet", options.timeout_s)}

        location / {{
            auth_request /__cloudgpu/auth;
            auth_request_set $tunnel_port $upstream_http_x_cloudgpu_tunnel_port;
            error_page 401 403 500 502 503 = @cloudgpu_page;
            # Only the proxy below times out with 504 (auth_request turns its own into 500).
            error_page 504 = @cloudgpu_quiet;

            proxy_pass http://127.0.0.1:$tunnel_port;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto {scheme};
            proxy_set_header X-Forwarded-Host $host;
            proxy_set_header X-CloudGPU-Gateway-Secret "";
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            # Stream both ways as bytes arrive: tokens, logs, uploads.
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout {timeout};
            proxy_send_timeout {timeout};
            send_timeout {timeout};
            proxy_connect_timeout 10s;
        }}
    }}
}}
"""


def keys_command_line(options: GatewayOptions) -> str:
    """sshd runs a key command only if the program is root's, in folders only root may write
    to: root's gateway writes its own wrapper; a user's cannot, so it names the system's
    Python (root's) and gives it the script as an argument."""
    if options.unprivileged:
        folder = options.folder
        return f"{options.python} -I -S {folder / 'keys_command.py'} {folder / 'keys-command.json'}"
    return str(options.keys_command)


def keys_command_wrapper(options: GatewayOptions) -> str:
    return f"""#!/bin/sh
# sshd's AuthorizedKeysCommand (see sshd_config); asks the hub, prints its answer.
exec {options.python} -I -S {options.folder / "keys_command.py"} \\
  {options.folder / "keys-command.json"} "$@"
"""
