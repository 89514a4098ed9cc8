"""`cloudgpu ssh LEASE`: the system's ssh to a running lease's port 22 through the hub's SSH
gateway (ProxyJump as the renters' user, with the keys on your account), or the ssh config
Host entries for it (`--print-config`, `--write-config`).

The gateway's host keys come from the hub (the lease's `ssh.known_hosts`) into cloudgpu's own
known_hosts file, checked strictly: the hub is who you trust already. The rental's own sshd key
is remembered on first use under the lease's alias (HostKeyAlias), since its loopback port is
reused by later rentals."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import click

from cloudgpu_cli import config, output
from cloudgpu_cli.common import connect
from cloudgpu_cli.errors import EXIT_CODES_HELP, FAILED, HUB_ERROR, USAGE, CliError
from cloudgpu_cli.execute import after_dashes
from cloudgpu_cli.files import replace_marked_block, write_private

SSH_PORT = 22
_SAFE = re.compile(r"^[A-Za-z0-9._:\[\]-]+$")  # host names, users and aliases we put in config
INCLUDE_MARK = "cloudgpu include"


def gateway_alias(ssh: dict[str, Any]) -> str:
    host = re.sub(r"[^A-Za-z0-9.-]", "-", str(ssh["gateway_host"]))
    return f"cloudgpu-gateway-{host}-{ssh['gateway_port']}"


def _checked(ssh: Any) -> dict[str, Any]:
    """The API's `ssh` field, refused if anything in it could break out of a config line."""
    try:
        words = [ssh["gateway_host"], ssh["user"], ssh["host_alias"]]
        ports = [ssh["gateway_port"], *(f["listen_port"] for f in ssh["forwards"])]
        lines = list(ssh["known_hosts"])
    except (KeyError, TypeError):
        raise CliError("hub error: the lease's ssh details are incomplete", HUB_ERROR) from None
    if (
        not all(isinstance(w, str) and _SAFE.match(w) for w in words)
        or not all(type(p) is int and 0 < p < 65536 for p in ports)
        or not all(isinstance(line, str) and "\n" not in line for line in lines)
    ):
        raise CliError("hub error: the lease's ssh details are malformed", HUB_ERROR)
    return dict(ssh)


def lease_ssh(lease: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The lease's ssh details and the gateway port of its port 22, or why there are none."""
    lease_id = lease["id"]
    if lease["state"] != "running":
        raise CliError(f"lease {lease_id} is {lease['state']}: ssh needs a running lease", FAILED)
    if not lease.get("ssh"):
        raise CliError(
            f"lease {lease_id} has no SSH access: it needs a declared port and a hub with a"
            " tunnel gateway",
            FAILED,
        )
    ssh = _checked(lease["ssh"])
    port22 = next((f for f in ssh["forwards"] if f["port"] == SSH_PORT), None)
    if port22 is None:
        raise CliError(
            f"lease {lease_id} does not declare port 22: rent an image that runs sshd with"
            " --port 22 (other ports: the `ssh -L` lines of `cloudgpu show`)",
            FAILED,
        )
    return ssh, int(port22["listen_port"])


def ssh_dir() -> Path:
    return Path.home() / ".ssh"


def gateway_known_hosts() -> Path:
    return config.config_dir() / "known_hosts"


def rentals_known_hosts() -> Path:
    return config.config_dir() / "known_hosts.rentals"


def host_blocks(ssh: dict[str, Any], listen_port: int, identity: Path | None) -> str:
    """Two Host entries: the gateway (strict, with the hub's host keys) and the lease through
    it. Absolute paths: the file may be read as a user config (`~` works there) or by -F."""
    identity_lines = ""
    if identity is not None:
        identity_lines = f"    IdentityFile {identity.resolve()}\n    IdentitiesOnly yes\n"
    jump = gateway_alias(ssh)
    return (
        f"Host {jump}\n"
        f"    HostName {ssh['gateway_host']}\n"
        f"    Port {ssh['gateway_port']}\n"
        f"    User {ssh['user']}\n"
        f"    UserKnownHostsFile {gateway_known_hosts()}\n"
        f"    StrictHostKeyChecking yes\n"
        f"{identity_lines}"
        f"\n"
        f"Host {ssh['host_alias']}\n"
        f"    HostName 127.0.0.1\n"
        f"    Port {listen_port}\n"
        f"    User root\n"
        f"    ProxyJump {jump}\n"
        f"    HostKeyAlias {ssh['host_alias']}\n"
        f"    UserKnownHostsFile {rentals_known_hosts()}\n"
        f"    StrictHostKeyChecking accept-new\n"
        f"    ServerAliveInterval 30\n"
        f"{identity_lines}"
    )


def _store_known_hosts(ssh: dict[str, Any]) -> None:
    """The gateway's keys as the hub gives them now (a rotated key replaces the old)."""
    folder = config.config_dir()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(gateway_known_hosts(), "".join(f"{line}\n" for line in ssh["known_hosts"]))


def write_config(ssh: dict[str, Any], listen_port: int, identity: Path | None) -> Path:
    """The lease's entries in ~/.ssh/config.d/cloudgpu (one marked block per lease, replaced
    on rewrite), included from the top of ~/.ssh/config once, so they win over `Host *`."""
    folder = ssh_dir()
    (folder / "config.d").mkdir(parents=True, exist_ok=True, mode=0o700)
    target = folder / "config.d" / "cloudgpu"
    text = target.read_text() if target.exists() else ""
    text = replace_marked_block(
        text, f"cloudgpu {ssh['host_alias']}", host_blocks(ssh, listen_port, identity)
    )
    write_private(target, text)
    main = folder / "config"
    text = main.read_text() if main.exists() else ""
    write_private(
        main, replace_marked_block(text, INCLUDE_MARK, f"Include {target}\n", at_top=True)
    )
    return target


@click.command(
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog=EXIT_CODES_HELP,
)
@click.option("--print-config", is_flag=True, help="Print the ssh config Host entries.")
@click.option(
    "--write-config",
    "write_config_",
    is_flag=True,
    help="Write them to ~/.ssh/config.d/cloudgpu (included from ~/.ssh/config).",
)
@click.option(
    "-i",
    "--identity",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The private key of a public key on your account (default: ssh's own).",
)
@click.argument("lease_id")
@click.argument("ssh_args", nargs=-1, type=click.UNPROCESSED)
def ssh(
    lease_id: str,
    ssh_args: tuple[str, ...],
    print_config: bool,
    write_config_: bool,
    identity: Path | None,
) -> None:
    """SSH into a running lease through the hub's gateway.

    The lease's port 22 must run sshd with your account's keys (e.g. the Ubuntu with SSH
    template). SSH_ARGS go to ssh: `cloudgpu ssh L -- nvidia-smi`. Options go before
    LEASE_ID.
    """
    if print_config and write_config_:
        raise CliError("--print-config or --write-config, not both", USAGE)
    with connect() as api:
        lease = api.get(f"/api/v1/leases/{lease_id}/")
    details, listen_port = lease_ssh(lease)
    _store_known_hosts(details)
    blocks = host_blocks(details, listen_port, identity)
    if print_config:
        output.out.print(blocks, end="", highlight=False, markup=False)
        return
    if write_config_:
        path = write_config(details, listen_port, identity)
        output.err.print(
            f"wrote Host {details['host_alias']} to {path}: ssh {details['host_alias']}"
        )
        return
    exec_ssh(blocks, details["host_alias"], list(after_dashes(ssh_args)))


def exec_ssh(blocks: str, alias: str, args: list[str]) -> None:
    """Replace this process with the system's ssh (no shell): its own config file, then the
    user's ~/.ssh/config for everything else (keys, agent)."""
    program = shutil.which("ssh")
    if program is None:
        raise CliError("no ssh on PATH: install the OpenSSH client", FAILED)
    own = config.config_dir() / "ssh_config"
    user_config = ssh_dir() / "config"
    text = blocks
    if user_config.exists():
        text += f"\nMatch all\n    Include {user_config}\n"
    write_private(own, text)
    os.execv(program, ["ssh", "-F", str(own), alias, *args])  # noqa: S606 - no shell, on purpose
