"""The `cloudgpu` command: click commands over the hub's REST API (docs/api.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.status import Status

from cloudgpu_cli import config, filters, output
from cloudgpu_cli.api import Api
from cloudgpu_cli.errors import (
    EXIT_CODES_HELP,
    FAILED,
    INTERRUPTED,
    OK,
    USAGE,
    CliError,
)

ACTIVE = {"pending", "reserving", "starting", "running", "stopping"}
DONE = {"running", "failed", "ended"}
WAIT_DEADLINE_S = 600.0
WAIT_POLL_S = 1.0
LOGS_POLL_S = 2.0

json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")


def _api() -> Api:
    settings = config.resolve()
    return Api(settings.hub, config.require_token(settings))


@click.group(epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Rent GPUs on a CloudGPU hub from your terminal.

    Log in once with an API token from the dashboard's API tokens page; CLOUDGPU_HUB and
    CLOUDGPU_TOKEN override the stored hub and token.
    """


@cli.command(epilog=EXIT_CODES_HELP)
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
    with Api(settings.hub, token) as api:
        account = api.get("/api/v1/account/")
    stored = config.read_file()
    stored.update(hub=settings.hub, token=token)
    path = config.write_file(stored)
    output.err.print(f"logged in to {settings.hub} as {account['username']} ({path})")


@cli.command(epilog=EXIT_CODES_HELP)
def logout() -> None:
    """Forget the stored token."""
    stored = config.read_file()
    if stored.pop("token", None) is None:
        output.err.print("not logged in")
        return
    config.write_file(stored)
    output.err.print("logged out")


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("terms", nargs=-1, metavar="[FILTER ...]")
@click.option("--sort", type=click.Choice(["price", "-price", "vram", "model"]), default="price")
@click.option("--limit", type=click.IntRange(1, 1000), default=None, help="Offers per page.")
@click.option("--all", "follow", is_flag=True, help="Follow every page, not only the first.")
@json_option
def offers(
    terms: tuple[str, ...], sort: str, limit: int | None, follow: bool, as_json: bool
) -> None:
    """GPUs for rent now. FILTER is FIELD OP VALUE, e.g.:

    gpu=4090 vram>=24 price<=1.5 num_gpus>=2 location=US cpus>=16 ram>=64 disk>=100
    cuda>=12.4 rtt<=50 uptime>=99

    (vram, ram, disk in GiB; price per hour per GPU; uptime in % of the last 7 days.)
    """
    params: dict[str, Any] = filters.to_params(list(terms))
    params["sort"] = sort
    if limit:
        params["limit"] = limit
    found: list[dict[str, Any]] = []
    with _api() as api:
        for page in api.pages("/api/v1/offers/", params, follow):
            found.extend(page)
    if as_json:
        output.emit_json(found)
    elif not found:
        output.err.print("no offers match")
    else:
        output.out.print(output.offers_table(found))


def _env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--env takes K=V, not {pair!r}", USAGE)
        env[key] = value
    return env


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("gpu_ids", nargs=-1, type=int)
@click.option("--gpus", "selection", help="A selection instead of ids, e.g. count=2.")
@click.option("--image", help="A container image.")
@click.option("--template", help="A template slug.")
@click.option("--port", "ports", multiple=True, type=click.IntRange(1, 65535))
@click.option("--env", "env", multiple=True, metavar="K=V")
@click.option("--max-price", type=str, help="Refuse if the total price/h rose above this.")
@click.option("--wait/--no-wait", default=True, help="Wait until running, failed or ended.")
@json_option
def rent(
    gpu_ids: tuple[int, ...],
    selection: str | None,
    image: str | None,
    template: str | None,
    ports: tuple[int, ...],
    env: tuple[str, ...],
    max_price: str | None,
    wait: bool,
    as_json: bool,
) -> None:
    """Rent GPUs: GPU_ID... (offers' gpu ids, one host) or --gpus SELECTION."""
    if bool(gpu_ids) == bool(selection):
        raise CliError("give GPU ids or --gpus, one of the two", USAGE)
    if not image and not template:
        raise CliError("give --image or --template", USAGE)
    body: dict[str, Any] = {"gpu_ids": list(gpu_ids)} if gpu_ids else {"gpus": selection}
    if image:
        body["image"] = image
    if template:
        body["template"] = template
    if ports:
        body["ports"] = list(ports)
    if env:
        body["env"] = _env(env)
    if max_price is not None:
        body["max_price_per_hour"] = max_price
    with _api() as api:
        lease = api.post("/api/v1/leases/", body)
        if wait:
            lease = _wait(api, lease)
    if as_json:
        output.emit_json(lease)
    else:
        for line in output.lease_details(lease):
            output.out.print(line, highlight=False, markup=False)
    if lease["state"] in ("failed", "ended"):
        sys.exit(FAILED)


def _wait(api: Api, lease: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_DEADLINE_S
    with Status(f"lease {lease['id']}: {lease['state']}", console=output.err) as status:
        while lease["state"] not in DONE:
            if time.monotonic() > deadline:
                raise CliError(f"lease {lease['id']} still {lease['state']} after 10 min", FAILED)
            time.sleep(WAIT_POLL_S)
            lease = api.get(f"/api/v1/leases/{lease['id']}/")
            status.update(f"lease {lease['id']}: {lease['state']}")
    return lease


@cli.command("ls", epilog=EXIT_CODES_HELP)
@click.option("--all", "show_all", is_flag=True, help="Ended and failed leases too.")
@json_option
def ls(show_all: bool, as_json: bool) -> None:
    """Your leases (active ones unless --all)."""
    leases: list[dict[str, Any]] = []
    with _api() as api:
        url: str | None = "/api/v1/leases/?limit=200"
        while url:
            page = api.get(url)
            leases.extend(page["results"])
            url = page.get("next")
    if not show_all:
        leases = [lease for lease in leases if lease["state"] in ACTIVE]
    if as_json:
        output.emit_json(leases)
    elif not leases:
        output.err.print("no leases" if show_all else "no active leases (--all for every one)")
    else:
        output.out.print(output.leases_table(leases))


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("lease_id")
@json_option
def show(lease_id: str, as_json: bool) -> None:
    """One lease: state, URLs, ssh."""
    with _api() as api:
        lease = api.get(f"/api/v1/leases/{lease_id}/")
    if as_json:
        output.emit_json(lease)
    else:
        for line in output.lease_details(lease):
            output.out.print(line, highlight=False, markup=False)


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("lease_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until it ends.")
@json_option
def logs(lease_id: str, follow: bool, as_json: bool) -> None:
    """A lease's recent output the hub kept (and the exit-time tail)."""
    url = f"/api/v1/leases/{lease_id}/logs/"
    with _api() as api:
        body = api.get(url)
        if as_json and not follow:
            output.emit_json(body)
            return
        text = body.get("log") or body.get("log_tail") or ""
        if not text and not follow:
            # The hub keeps live output only while someone follows it (the lease page, -f).
            output.err.print("(no output kept by the hub for this lease yet)")
        _write(text)
        while follow and body["state"] in ACTIVE:
            time.sleep(LOGS_POLL_S)
            body = api.get(url)
            now = body.get("log") or body.get("log_tail") or ""
            _write(_new_part(text, now))
            text = now


def _new_part(before: str, now: str) -> str:
    """What `now` adds to `before`; the hub keeps a window of chunks, so the old text may have
    scrolled off its front: find the longest end of `before` that starts `now`."""
    if now.startswith(before):
        return now[len(before) :]
    for cut in range(len(before)):
        tail = before[cut:]
        if now.startswith(tail):
            return now[len(tail) :]
    return now


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("lease_id")
@json_option
def stop(lease_id: str, as_json: bool) -> None:
    """Stop a lease (stopping twice is fine)."""
    with _api() as api:
        lease = api.post(f"/api/v1/leases/{lease_id}/stop/")
    if as_json:
        output.emit_json(lease)
    else:
        output.err.print(f"lease {lease_id}: {lease.get('state', 'stopping')}")


@cli.command(epilog=EXIT_CODES_HELP)
@json_option
def balance(as_json: bool) -> None:
    """Your balance and newest ledger rows."""
    with _api() as api:
        account = api.get("/api/v1/account/")
    if as_json:
        output.emit_json(account)
        return
    output.out.print(f"{account['username']}: balance {account['balance']}", highlight=False)
    for line in output.ledger_lines(account.get("ledger", [])[:10]):
        output.out.print(line, highlight=False, markup=False)


@cli.group(invoke_without_command=True, epilog=EXIT_CODES_HELP)
@json_option
@click.pass_context
def keys(ctx: click.Context, as_json: bool) -> None:
    """Your SSH public keys (`keys add FILE` adds one)."""
    if ctx.invoked_subcommand is not None:
        return
    with _api() as api:
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
    with _api() as api:
        key = api.post("/api/v1/ssh-keys/", {"public_key": line})
    if as_json:
        output.emit_json(key)
    else:
        output.err.print(f"added {key['key_type']} {key['fingerprint']}")


def run(entry: click.Command, args: list[str] | None = None) -> int:
    """Run click without its own exit handling, so every failure is one line and a code."""
    try:
        entry.main(args=args, prog_name="cloudgpu", standalone_mode=False)
    except CliError as exc:
        # Plain, not rich: rich wraps at the console width, and this must stay one line.
        click.echo(f"cloudgpu: {exc.message}", err=True)
        return exc.code
    except click.exceptions.Abort:
        return INTERRUPTED
    except KeyboardInterrupt:
        return INTERRUPTED
    except click.ClickException as exc:
        exc.show()
        return USAGE
    except click.exceptions.Exit as exc:
        return exc.exit_code
    return OK


def main() -> None:
    try:
        sys.exit(run(cli))
    except KeyboardInterrupt:
        sys.exit(INTERRUPTED)
