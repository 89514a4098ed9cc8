"""`cloudgpu rent`: every GPU selection the API's lease create takes, an image or a template
with its ports, env, command, warm-up and volumes, and a progress line while it starts."""

from __future__ import annotations

import shlex
import time
import uuid
from contextlib import nullcontext
from typing import Any

import click
from rich.markup import escape
from rich.status import Status

from cloudgpu_cli import output
from cloudgpu_cli.api import Api
from cloudgpu_cli.common import connect, json_option, print_lines
from cloudgpu_cli.errors import EXIT_CODES_HELP, FAILED, INTERRUPTED, USAGE, CliError

DONE = {"running", "failed", "ended"}
WAIT_DEADLINE_S = 600.0
WAIT_POLL_S = 1.0
MAX_VOLUMES = 4  # the API's VolumeMountSerializer max_length
STATUS_LINE_CHARS = 70


def parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--env takes K=V, not {pair!r}", USAGE)
        env[key] = value
    return env


def parse_argv(option: str, text: str) -> list[str]:
    """A command line as the shell would split it, sent as argv: the hub implies no shell."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise CliError(f"{option}: {exc}", USAGE) from None
    if not argv:
        raise CliError(f"{option} needs a command", USAGE)
    return argv


def gpu_choice(
    gpu_ids: tuple[int, ...], selection: str | None, host_id: int | None, model: str | None
) -> dict[str, Any]:
    """The lease body's GPU part: `gpu_ids`, or `gpus` with `host_id` (indices, `all`, UUIDs,
    `count=N`) or `gpus` `count=N` alone with an optional `gpu_model`."""
    if bool(gpu_ids) == bool(selection):
        raise CliError("give GPU ids or --gpus SELECTION, one of the two", USAGE)
    if gpu_ids:
        if host_id is not None or model:
            raise CliError("GPU ids name their host: --host and --model go with --gpus", USAGE)
        return {"gpu_ids": list(gpu_ids)}
    body: dict[str, Any] = {"gpus": selection}
    if host_id is not None:
        body["host_id"] = host_id
    if model:
        body["gpu_model"] = model
    return body


def volume_mounts(api: Api, specs: tuple[str, ...], host_id: int | None) -> list[dict[str, str]]:
    """`--volume NAME_OR_ID:/path` as the API's `{"volume_id", "path"}`; a name is looked up
    among your active volumes (on --host when given)."""
    if len(specs) > MAX_VOLUMES:
        raise CliError(f"at most {MAX_VOLUMES} --volume", USAGE)
    mounts = []
    listed: list[dict[str, Any]] | None = None
    for spec in specs:
        # Paths are absolute and names have no colon: the first ":/" splits them.
        name, sep, rest = spec.partition(":/")
        if not sep or not name:
            raise CliError(f"--volume takes NAME:/path or ID:/path, not {spec!r}", USAGE)
        try:
            volume_id = str(uuid.UUID(name))
        except ValueError:
            if listed is None:
                listed = api.get("/api/v1/volumes/")
            volume_id = _volume_named(listed or [], name, host_id)
        mounts.append({"volume_id": volume_id, "path": "/" + rest})
    return mounts


def _volume_named(volumes: list[dict[str, Any]], name: str, host_id: int | None) -> str:
    found = [
        v
        for v in volumes
        if v["name"] == name
        and v.get("kind") == "volume"
        and v.get("state") == "active"
        and (host_id is None or v["host_id"] == host_id)
    ]
    if not found:
        where = f" on host {host_id}" if host_id is not None else ""
        raise CliError(f"no active volume called {name!r}{where} (see `cloudgpu volumes`)", USAGE)
    if len(found) > 1:
        raise CliError(f"volumes called {name!r} on several hosts: give --host or its id", USAGE)
    return str(found[0]["id"])


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("gpu_ids", nargs=-1, type=click.IntRange(min=1))
@click.option(
    "--gpus",
    "selection",
    help="A selection instead of ids: all, count=N, 0,1 (indices), GPU-<uuid>,...",
)
@click.option("--host", "host_id", type=click.IntRange(min=1), help="The host for --gpus.")
@click.option("--model", help="With --gpus count=N: only GPUs whose name contains this.")
@click.option("--image", help="A container image (or overrides the template's).")
@click.option("--template", help="A template slug (`cloudgpu templates` lists them).")
@click.option("--port", "ports", multiple=True, type=click.IntRange(1, 65535), help="Repeatable.")
@click.option("--env", "env", multiple=True, metavar="K=V", help="Repeatable.")
@click.option(
    "--command", "command", metavar="CMD", help="What the container runs, e.g. 'sleep 1d'."
)
@click.option("--warmup", metavar="CMD", help="Run once ports answer, before it counts as running.")
@click.option("--no-warmup", is_flag=True, help="Skip the template's warm-up.")
@click.option(
    "--volume", "volumes", multiple=True, metavar="NAME:/PATH", help="Mount a volume of yours."
)
@click.option("--protect", is_flag=True, help="URLs need the lease's access token.")
@click.option("--max-price", type=str, help="Refuse if the total price/h is above this now.")
@click.option("--wait/--no-wait", default=True, help="Wait until running, failed or ended.")
@json_option
def rent(
    gpu_ids: tuple[int, ...],
    selection: str | None,
    host_id: int | None,
    model: str | None,
    image: str | None,
    template: str | None,
    ports: tuple[int, ...],
    env: tuple[str, ...],
    command: str | None,
    warmup: str | None,
    no_warmup: bool,
    volumes: tuple[str, ...],
    protect: bool,
    max_price: str | None,
    wait: bool,
    as_json: bool,
) -> None:
    """Rent GPUs and wait until the rental runs.

    Which GPUs: GPU_ID... (offers' gpu ids, one host), or --gpus SELECTION with --host
    (all, 0,1 for indices, GPU-<uuid>,..., count=N), or --gpus count=N alone (the cheapest
    online host with N free, optionally --model). What runs: --image or --template.
    """
    body = gpu_choice(gpu_ids, selection, host_id, model)
    if not image and not template:
        raise CliError("give --image or --template", USAGE)
    if warmup is not None and no_warmup:
        raise CliError("--warmup or --no-warmup, not both", USAGE)
    for key, value in (("image", image), ("template", template)):
        if value:
            body[key] = value
    if ports:
        body["ports"] = list(ports)
    if env:
        body["env"] = parse_env(env)
    if command is not None:
        body["command"] = parse_argv("--command", command)
    if warmup is not None:
        body["warmup"] = parse_argv("--warmup", warmup)
    elif no_warmup:
        body["warmup"] = []
    if protect:
        body["access_protected"] = True
    if max_price is not None:
        body["max_price_per_hour"] = max_price.strip().lstrip("$")
    with connect() as api:
        if volumes:
            body["volumes"] = volume_mounts(api, volumes, host_id)
        lease = api.post("/api/v1/leases/", body)
        if wait:
            lease = wait_until_settled(api, lease)
    if as_json:
        output.emit_json(lease)
    else:
        print_lines(output.lease_details(lease))
    if lease["state"] in ("failed", "ended"):
        raise SystemExit(FAILED)


def wait_until_settled(api: Api, lease: dict[str, Any]) -> dict[str, Any]:
    """Poll the lease until it runs, fails or ends; on a terminal a rich status line says
    where it is (and the warm-up's latest line), elsewhere nothing (scripts read the result)."""
    started = time.monotonic()
    deadline = started + WAIT_DEADLINE_S
    progress = (
        Status(_progress(lease, 0, ""), console=output.err) if output.err.is_terminal else None
    )
    try:
        with progress or nullcontext():
            while lease["state"] not in DONE:
                if time.monotonic() > deadline:
                    raise CliError(
                        f"lease {lease['id']} still {lease['state']} after"
                        f" {WAIT_DEADLINE_S / 60:.0f} min; `cloudgpu show {lease['id']}`",
                        FAILED,
                    )
                time.sleep(WAIT_POLL_S)  # the hub pushes nothing to token clients: poll
                lease = api.get(f"/api/v1/leases/{lease['id']}/")
                if progress is not None:
                    line = _warmup_line(api, lease)
                    progress.update(_progress(lease, time.monotonic() - started, line))
    except KeyboardInterrupt:
        # The rental goes on starting (and is charged once running): say how to end it.
        raise CliError(
            f"interrupted; lease {lease['id']} is {lease['state']}:"
            f" `cloudgpu stop {lease['id']}` ends it",
            INTERRUPTED,
        ) from None
    return lease


def _warmup_line(api: Api, lease: dict[str, Any]) -> str:
    """The warm-up's latest output line while it runs: the agent streams it to the hub's
    backlog whether or not anyone follows the logs."""
    if lease["state"] != "starting" or not lease.get("warmup"):
        return ""
    text = api.get(f"/api/v1/leases/{lease['id']}/logs/").get("log") or ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _progress(lease: dict[str, Any], elapsed_s: float, warmup_line: str) -> str:
    text = f"lease {str(lease['id'])[:8]}: {lease['state']} ({elapsed_s:.0f} s)"
    if warmup_line:
        text += f" · {warmup_line}"
    if len(text) > STATUS_LINE_CHARS:
        text = text[: STATUS_LINE_CHARS - 1] + "…"
    # The line comes from the container: never let rich read markup in it.
    return escape(text)
