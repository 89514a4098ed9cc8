"""Your leases once rented: `ls`, `show`, `logs [-f]`, `stop`."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from cloudgpu_cli import output
from cloudgpu_cli.common import connect, json_option, print_lines
from cloudgpu_cli.errors import EXIT_CODES_HELP

ACTIVE = {"pending", "reserving", "starting", "running", "stopping"}
LOGS_POLL_S = 2.0


@click.command("ls", epilog=EXIT_CODES_HELP)
@click.option("--all", "show_all", is_flag=True, help="Ended and failed leases too.")
@json_option
def ls(show_all: bool, as_json: bool) -> None:
    """Your leases (active ones unless --all)."""
    leases: list[dict[str, Any]] = []
    with connect() as api:
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


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("lease_id")
@json_option
def show(lease_id: str, as_json: bool) -> None:
    """One lease: state, URLs, ssh, cost."""
    with connect() as api:
        lease = api.get(f"/api/v1/leases/{lease_id}/")
    if as_json:
        output.emit_json(lease)
    else:
        print_lines(output.lease_details(lease))


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("lease_id")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until it ends.")
@json_option
def logs(lease_id: str, follow: bool, as_json: bool) -> None:
    """A lease's recent output the hub kept (and the exit-time tail)."""
    url = f"/api/v1/leases/{lease_id}/logs/"
    with connect() as api:
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
            _write(new_part(text, now))
            text = now


def new_part(before: str, now: str) -> str:
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


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("lease_id")
@json_option
def stop(lease_id: str, as_json: bool) -> None:
    """Stop a lease (stopping twice is fine)."""
    with connect() as api:
        lease = api.post(f"/api/v1/leases/{lease_id}/stop/")
    if as_json:
        output.emit_json(lease)
    else:
        output.err.print(f"lease {lease_id}: {lease.get('state', 'stopping')}")
