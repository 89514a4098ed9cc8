"""Your account: `login`, `logout`, `balance`, `topup` and your SSH `keys`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from cloudgpu_cli import config, output
from cloudgpu_cli.api import Api
from cloudgpu_cli.common import connect, json_option, print_lines
from cloudgpu_cli.errors import EXIT_CODES_HELP, USAGE, CliError


@click.command(epilog=EXIT_CODES_HELP)
@click.option("--hub", help=f"The hub's URL (default: CLOUDGPU_HUB or {config.DEFAULT_HUB}).")
def login(hub: str | None) -> None:
    """Store an API token (asked hidden, or read from stdin when piped)."""
    settings = config.resolve(hub)
    if sys.stdin.isatty():
        token = click.prompt("API token", hide_input=True, err=True)
    else:
        token = sys.stdin.readline()
    token = token.strip()
    if not token:
        raise CliError("no token given", USAGE)
    with Api(settings.hub, token, settings.timeout_s) as api:
        account = api.get("/api/v1/account/")
    stored = config.read_file()
    stored.update(hub=settings.hub, token=token)
    path = config.write_file(stored)
    output.err.print(f"logged in to {settings.hub} as {account['username']} ({path})")


@click.command(epilog=EXIT_CODES_HELP)
def logout() -> None:
    """Forget the stored token."""
    stored = config.read_file()
    if stored.pop("token", None) is None:
        output.err.print("not logged in")
        return
    config.write_file(stored)
    output.err.print("logged out")


@click.command(epilog=EXIT_CODES_HELP)
@json_option
def balance(as_json: bool) -> None:
    """Your balance and newest ledger rows."""
    with connect() as api:
        account = api.get("/api/v1/account/")
    if as_json:
        output.emit_json(account)
        return
    output.out.print(f"{account['username']}: balance {account['balance']}", highlight=False)
    print_lines(output.ledger_lines(account.get("ledger", [])[:10]))


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("amount")
@click.option("--note", default="", help="For the admins: how you will pay, or what it is for.")
@json_option
def topup(amount: str, note: str, as_json: bool) -> None:
    """Ask an admin to add funds.

    AMOUNT is in units, e.g. 25.00; the request waits for an admin, who adds it to your
    balance (`cloudgpu balance` shows it then).
    """
    with connect() as api:
        request = api.post("/api/v1/top-ups/", {"amount": amount.strip().lstrip("$"), "note": note})
    if as_json:
        output.emit_json(request)
    else:
        output.err.print(
            f"asked for {request['amount']} (request {request['id']}, {request['state']}):"
            " an admin adds it to your balance; `cloudgpu balance` shows it when they do"
        )


@click.group(invoke_without_command=True, epilog=EXIT_CODES_HELP)
@json_option
@click.pass_context
def keys(ctx: click.Context, as_json: bool) -> None:
    """Your SSH public keys; `keys add FILE`, `keys delete ID`."""
    if ctx.invoked_subcommand is not None:
        return
    with connect() as api:
        found = api.get("/api/v1/ssh-keys/")
    if as_json:
        output.emit_json(found)
    elif not found:
        output.err.print("no SSH keys")
    else:
        output.out.print(output.keys_table(found))


@keys.command("add", epilog=EXIT_CODES_HELP)
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
def keys_add(file: Path, as_json: bool) -> None:
    """Add the public key in FILE (e.g. ~/.ssh/id_ed25519.pub)."""
    line = file.read_text().strip()
    if "PRIVATE KEY" in line:
        raise CliError(f"{file} is a private key: give the .pub file", USAGE)
    with connect() as api:
        key = api.post("/api/v1/ssh-keys/", {"public_key": line})
    if as_json:
        output.emit_json(key)
    else:
        output.err.print(f"added {key['key_type']} {key['fingerprint']}")


@keys.command("delete", epilog=EXIT_CODES_HELP)
@click.argument("key_id", type=click.IntRange(min=1))
def keys_delete(key_id: int) -> None:
    """Delete the key with id KEY_ID (from `cloudgpu keys`)."""
    with connect() as api:
        api.delete(f"/api/v1/ssh-keys/{key_id}/")
    output.err.print(f"deleted key {key_id}")
