"""`cloudgpu volumes`: your volumes on hosts (list, create, resize, delete); `rent --volume`
mounts one into a rental on its host."""

from __future__ import annotations

import uuid
from typing import Any

import click

from cloudgpu_cli import output
from cloudgpu_cli.api import Api
from cloudgpu_cli.common import connect, json_option
from cloudgpu_cli.errors import EXIT_CODES_HELP, USAGE, CliError


@click.group(invoke_without_command=True, epilog=EXIT_CODES_HELP)
@click.option("--all", "show_all", is_flag=True, help="Removed ones too, with why.")
@json_option
@click.pass_context
def volumes(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """Your volumes and template caches; `volumes create|resize|delete`."""
    if ctx.invoked_subcommand is not None:
        return
    with connect() as api:
        found: list[dict[str, Any]] = api.get("/api/v1/volumes/")
    if not show_all:
        found = [v for v in found if v.get("state") != "removed"]
    if as_json:
        output.emit_json(found)
    elif not found:
        output.err.print("no volumes" + ("" if show_all else " (--all for removed ones)"))
    else:
        output.out.print(output.volumes_table(found))


def _resolve(api: Api, volume: str) -> str:
    """A volume's id from its id or its name (a name on several hosts needs the id)."""
    try:
        return str(uuid.UUID(volume))
    except ValueError:
        pass
    found = [
        v
        for v in api.get("/api/v1/volumes/")
        if v["name"] == volume and v.get("kind") == "volume" and v.get("state") != "removed"
    ]
    if len(found) != 1:
        why = "no volume" if not found else "several volumes (one per host): give the id of the"
        raise CliError(f"{why} called {volume!r}; `cloudgpu volumes` lists them", USAGE)
    return str(found[0]["id"])


@volumes.command("create", epilog=EXIT_CODES_HELP)
@click.argument("name")
@click.option("--host", "host_id", required=True, type=click.IntRange(min=1), help="Its host.")
@click.option("--size", "size_gib", required=True, type=click.IntRange(min=1), help="GiB.")
@json_option
def create(name: str, host_id: int, size_gib: int, as_json: bool) -> None:
    """Create volume NAME on a host (an offer's host_id)."""
    with connect() as api:
        volume = api.post(
            "/api/v1/volumes/", {"host_id": host_id, "name": name, "size_gib": size_gib}
        )
    if as_json:
        output.emit_json(volume)
    else:
        output.out.print(volume["id"], highlight=False)
        output.err.print(f"created {volume['name']} on {volume['hostname']} ({size_gib} GiB)")


@volumes.command("resize", epilog=EXIT_CODES_HELP)
@click.argument("volume")
@click.option("--size", "size_gib", required=True, type=click.IntRange(min=1), help="GiB.")
@json_option
def resize(volume: str, size_gib: int, as_json: bool) -> None:
    """Give VOLUME (name or id) a new size."""
    with connect() as api:
        body = api.patch(f"/api/v1/volumes/{_resolve(api, volume)}/", {"size_gib": size_gib})
    if as_json:
        output.emit_json(body)
    else:
        output.err.print(f"{body['name']}: {size_gib} GiB")


@volumes.command("delete", epilog=EXIT_CODES_HELP)
@click.argument("volume")
@json_option
def delete(volume: str, as_json: bool) -> None:
    """Delete VOLUME (name or id) and its files (refused while a rental mounts it)."""
    with connect() as api:
        body = api.delete(f"/api/v1/volumes/{_resolve(api, volume)}/")
    if as_json:
        output.emit_json(body)
    else:
        output.err.print(f"{body['name']}: {body['state']}")
