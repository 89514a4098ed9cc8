"""The tunnel gateway: OpenSSH's sshd for the agents' ``ssh -R`` plus nginx as the edge proxy,
both configured to ask the hub, supervised in the foreground.

    python -m hub.tunnels.gateway run --hub-url http://127.0.0.1:8000 [--folder DIR] ...
    python -m hub.tunnels.gateway host-key [--folder DIR]   # the line for the hub's
                                                           # TUNNEL_GATEWAY_HOST_KEYS_FILE

The secret shared with the hub comes from TUNNEL_GATEWAY_SECRET or TUNNEL_GATEWAY_SECRET_FILE.
Runs as root (sshd needs it to switch users); the login users (agents' cloudgpu-tunnel, renters'
cloudgpu-ssh) must exist. Run by another user (the local trial's), sshd logs in only that user:
agents log in as it (--user and --keys-command-user that user) and renters' SSH is off
(--renter-user '').
"""

from __future__ import annotations

import argparse
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hub.lib.env import EnvError, env_secret
from hub.lib.supervise import Supervisor
from hub.tunnels.gateway_config import (
    DEFAULT_TIMEOUT_S,
    TIMEOUT_FLOOR_S,
    GatewayOptions,
    keys_command_wrapper,
    render_nginx_config,
    render_sshd_config,
)
from hub.tunnels.ssh_listener import SshListener

SSHD = "/usr/sbin/sshd"
CUT_CHECK_S = 1.0
DEFAULT_FOLDER = Path("/var/lib/cloudgpu-gateway")


class GatewayError(Exception):
    """The gateway cannot start; the message says what to do."""


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def check(options: GatewayOptions) -> None:
    if options.unprivileged:
        # sshd that is not root can log in only the user it runs as, for agents' forwards.
        me = pwd.getpwuid(os.geteuid()).pw_name
        if options.user != me or options.keys_command_user != me or options.renter_user:
            raise GatewayError(
                f"not running as root, the gateway serves only its own user: --user {me} "
                f"--keys-command-user {me} --renter-user '' (renters' SSH needs root)"
            )
    elif os.geteuid() != 0:
        raise GatewayError("the gateway runs as root: sshd needs it to switch to the login user")
    if not Path(SSHD).exists():
        raise GatewayError("sshd is not installed: apt install openssh-server")
    if shutil.which("nginx") is None:
        raise GatewayError("nginx is not installed: apt install nginx-light")
    for name in (options.user, options.renter_user, options.keys_command_user):
        if not name:
            continue  # no renter user: renter SSH is off
        try:
            pwd.getpwnam(name)
        except KeyError:
            raise GatewayError(
                f"user {name!r} does not exist: "
                f"useradd --system --no-create-home --shell /usr/sbin/nologin {name}"
            ) from None
    for name in (options.user, options.renter_user):
        if name and _locked(name):
            raise GatewayError(
                f"user {name!r} is locked ('!' in /etc/shadow) and sshd refuses locked "
                f"accounts even for keys; unlock it without a password: usermod -p '*' {name}"
            )
    if not Path(options.python).exists():
        raise GatewayError(f"{options.python} is missing: the key command runs on it")


def _locked(user: str) -> bool:
    try:
        lines = Path("/etc/shadow").read_text().splitlines()
    except OSError:
        return False
    entry = next((line.split(":") for line in lines if line.startswith(f"{user}:")), None)
    return entry is not None and len(entry) > 1 and entry[1].startswith("!")


def ephemeral_ports() -> tuple[int, int] | None:
    """Linux's range for outgoing connections' local ports (the hub's forward ports must stay
    out of it, or the edge's own connections can take a forward's port)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return None
    return int(low), int(high)


def check_folder(options: GatewayOptions) -> None:
    # sshd refuses an AuthorizedKeysCommand below a folder anyone else may write to.
    owners = {0, os.geteuid()}  # a user's own gateway keeps its files in its own folder
    for folder in [options.folder.resolve(), *options.folder.resolve().parents]:
        st = folder.stat()
        if st.st_uid not in owners or st.st_mode & 0o022:
            raise GatewayError(
                f"{folder} must be owned by root and writable by root only: sshd refuses "
                "key commands below it; choose a --folder such as /var/lib/cloudgpu-gateway"
            )
        if not options.unprivileged and not st.st_mode & 0o001:
            raise GatewayError(
                f"{folder} must be searchable by others (o+x): the key command runs as "
                f"{options.keys_command_user}"
            )


def render(options: GatewayOptions, secret: str) -> None:
    """Write every file the gateway runs on; keep the host key across restarts."""
    folder = options.folder
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)  # noqa: S103 - the key command's user must reach its script
    for sub in ("logs", "tmp"):
        (folder / sub).mkdir(exist_ok=True)
    if not options.host_key.exists():
        subprocess.run(
            [
                *("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "cloudgpu-gateway"),
                *("-f", str(options.host_key)),
            ],
            check=True,
        )
    shutil.copyfile(Path(__file__).with_name("keys_command.py"), folder / "keys_command.py")
    os.chmod(folder / "keys_command.py", 0o644)
    config = {"hub_url": options.hub_url, "secret": secret}
    _write(folder / "keys-command.json", json.dumps(config), 0o640)
    if not options.unprivileged:
        command_user = pwd.getpwnam(options.keys_command_user)
        os.chown(folder / "keys-command.json", 0, command_user.pw_gid)
    _write(options.keys_command, keys_command_wrapper(options), 0o755)
    _write(folder / "sshd_config", render_sshd_config(options), 0o600)
    _write(folder / "nginx.conf", render_nginx_config(options, secret), 0o600)
    if options.unprivileged:
        return  # nginx's workers are this user too
    # nginx's workers (nobody when the master is root) write request bodies under tmp/.
    nobody = pwd.getpwnam("nobody")
    os.chown(folder / "tmp", nobody.pw_uid, grp.getgrgid(nobody.pw_gid).gr_gid)


def validate(options: GatewayOptions) -> None:
    folder = options.folder
    for argv, what in (
        ([SSHD, "-t", "-f", str(folder / "sshd_config")], "sshd"),
        (["nginx", "-e", "stderr", "-t", "-q", "-c", str(folder / "nginx.conf")], "nginx"),
    ):
        result = subprocess.run(argv, capture_output=True, text=True)
        if result.returncode != 0:
            raise GatewayError(f"{what} refused its configuration: {result.stderr.strip()}")


def run(options: GatewayOptions, secret: str, ready: Path | None = None) -> int:
    check(options)
    render(options, secret)
    check_folder(options)
    # sshd's privilege-separation root; `sshd -t` refuses the configuration without it, and on
    # a fresh machine (or a tmpfs /run after boot) nothing else has made it yet.
    if not options.unprivileged:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    validate(options)
    folder = options.folder
    supervisor = Supervisor()
    listener = SshListener(
        SSHD, folder / "sshd_config", options.ssh_host, options.ssh_port, stderr=sys.stderr
    )
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        listener.start()
        # A socket left by an nginx that was killed would make this one's listen fail.
        options.route_cache_socket.unlink(missing_ok=True)
        supervisor.start(
            "nginx",
            # -e: not the built-in /var/log/nginx/error.log, which only root may open.
            ["nginx", "-e", "stderr", "-c", str(folder / "nginx.conf")],
            stop_signal=signal.SIGQUIT,
        )
        ephemeral = ephemeral_ports()
        if ephemeral:
            print(
                "tunnel gateway: this machine's ephemeral ports are "
                f"{ephemeral[0]}-{ephemeral[1]}; the hub's TUNNEL_LISTEN_PORT_MIN/MAX must not "
                "overlap them",
                flush=True,
            )
        print(
            f"tunnel gateway: ssh on {options.ssh_host}:{options.ssh_port}, "
            f"http on {options.http_host}:{options.http_port}, hub {options.hub_url}",
            flush=True,
        )
        if ready is not None:
            ready.write_text(f"{os.getpid()}\n")
        next_cut = time.monotonic() + CUT_CHECK_S
        while not stopping:
            if options.renter_user and time.monotonic() >= next_cut:
                # sshd fixes a login's permitopen list when it logs in: a renter connection
                # kept open past the hub's port quarantine could reach a port since handed to
                # another lease. Connections are ended before that (TUNNEL_PORT_QUARANTINE_S).
                cut = listener.cut_older_than(options.renter_user, options.renter_max_connection_s)
                if cut:
                    print(f"tunnel gateway: ended {cut} renter connection(s) at their age limit")
                next_cut = time.monotonic() + CUT_CHECK_S
            exited = supervisor.first_exited()
            if exited is not None or not listener.alive():
                name = exited.name if exited else "the ssh listener"
                print(f"tunnel gateway: {name} exited; stopping", file=sys.stderr)
                return 1
            time.sleep(0.5)
        return 0
    finally:
        listener.stop()
        supervisor.stop_all(timeout_s=10)


def host_key_line(folder: Path) -> str:
    return (folder / "ssh_host_ed25519_key.pub").read_text().strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hub.tunnels.gateway", description=__doc__)
    sub = parser.add_subparsers(dest="verb", required=True)
    run_parser = sub.add_parser("run", help="render the configuration and run sshd and nginx")
    for p in (run_parser, sub.add_parser("host-key", help="print the gateway's host key")):
        p.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    run_parser.add_argument("--hub-url", required=True, help="the hub as the gateway reaches it")
    run_parser.add_argument("--ssh-listen", default="0.0.0.0:2222")
    run_parser.add_argument("--http-listen", default="0.0.0.0:8080")
    run_parser.add_argument("--user", default="cloudgpu-tunnel")
    run_parser.add_argument(
        "--renter-user",
        default="cloudgpu-ssh",
        help="renters' login (ssh -J/-L to their own rentals' ports); '' turns it off; it must"
        " match the hub's TUNNEL_GATEWAY_RENTER_USER",
    )
    run_parser.add_argument(
        "--renter-max-connection-s",
        type=int,
        default=3300,
        help="renters' connections end after this long (default 3300: under the hub's "
        "TUNNEL_PORT_QUARANTINE_S of 3600, which must stay above it)",
    )
    run_parser.add_argument("--keys-command-user", default="nobody")
    run_parser.add_argument(
        "--timeout",
        type=int,
        default=int(os.environ.get("TUNNEL_EDGE_TIMEOUT_S", DEFAULT_TIMEOUT_S)),
        help="seconds a response may go quiet before the edge gives up (default 900, at least "
        f"{TIMEOUT_FLOOR_S})",
    )
    run_parser.add_argument(
        "--allow-short-timeout",
        action="store_true",
        help=f"tests only: let --timeout go below {TIMEOUT_FLOOR_S} s to see the edge cut",
    )
    run_parser.add_argument("--tls-cert", type=Path)
    run_parser.add_argument("--tls-key", type=Path)
    run_parser.add_argument("--nginx-workers", default="auto")
    run_parser.add_argument("--ready-file", type=Path, help="written once both servers started")
    run_parser.add_argument(
        "--python",
        default=shutil.which("python3", path="/usr/bin:/usr/local/bin") or "/usr/bin/python3",
        help="the interpreter sshd's key command runs on (standard library only)",
    )
    args = parser.parse_args(argv)
    if args.verb == "host-key":
        print(host_key_line(args.folder))
        return 0
    try:
        secret = env_secret("TUNNEL_GATEWAY_SECRET")
    except EnvError as exc:
        print(f"tunnel gateway: {exc}", file=sys.stderr)
        return 2
    if len(secret) < 32 or '"' in secret or "\\" in secret:
        print(
            "tunnel gateway: set TUNNEL_GATEWAY_SECRET (or _FILE) to the hub's value, 32+ "
            "characters without quotes, e.g. python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))'",
            file=sys.stderr,
        )
        return 2
    if args.timeout < TIMEOUT_FLOOR_S and not args.allow_short_timeout:
        print(
            f"tunnel gateway: --timeout (TUNNEL_EDGE_TIMEOUT_S) {args.timeout} is below "
            f"{TIMEOUT_FLOOR_S} s: long generations that stay quiet that long would be cut "
            f"(default {DEFAULT_TIMEOUT_S})",
            file=sys.stderr,
        )
        return 2
    ssh_host, _, ssh_port = args.ssh_listen.rpartition(":")
    http_host, _, http_port = args.http_listen.rpartition(":")
    options = GatewayOptions(
        folder=args.folder.absolute(),
        hub_url=args.hub_url,
        ssh_host=ssh_host.strip("[]") or "0.0.0.0",  # noqa: S104
        ssh_port=int(ssh_port),
        http_host=http_host.strip("[]") or "0.0.0.0",  # noqa: S104
        http_port=int(http_port),
        user=args.user,
        renter_user=args.renter_user,
        unprivileged=os.geteuid() != 0,
        renter_max_connection_s=args.renter_max_connection_s,
        keys_command_user=args.keys_command_user,
        timeout_s=args.timeout,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        nginx_workers=args.nginx_workers,
        python=args.python,
    )
    try:
        return run(options, secret, args.ready_file)
    except (GatewayError, ValueError) as exc:
        print(f"tunnel gateway: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
