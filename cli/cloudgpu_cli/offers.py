"""What there is to rent: `offers` (with the filter syntax) and `templates`."""

from __future__ import annotations

from typing import Any

import click

from cloudgpu_cli import filters, output
from cloudgpu_cli.common import connect, json_option
from cloudgpu_cli.errors import EXIT_CODES_HELP


@click.command(epilog=EXIT_CODES_HELP)
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
    with connect() as api:
        for page in api.pages("/api/v1/offers/", params, follow):
            found.extend(page)
    if as_json:
        output.emit_json(found)
    elif not found:
        output.err.print("no offers match")
    else:
        output.out.print(output.offers_table(found))


@click.command(epilog=EXIT_CODES_HELP)
@json_option
def templates(as_json: bool) -> None:
    """Templates for `rent --template SLUG`: image, ports, warm-up."""
    with connect() as api:
        found = api.get("/api/v1/templates/")
    if as_json:
        output.emit_json(found)
    elif not found:
        output.err.print("no templates")
    else:
        output.out.print(output.templates_table(found))
