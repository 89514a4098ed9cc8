"""What every command module shares: the --json option, an Api from the stored settings, and
printing lines as they are (no rich markup read into a container's output or an image name)."""

from __future__ import annotations

from collections.abc import Iterable

import click

from cloudgpu_cli import config, output
from cloudgpu_cli.api import Api

json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")


def connect() -> Api:
    settings = config.resolve()
    return Api(settings.hub, config.require_token(settings), settings.timeout_s)


def print_lines(lines: Iterable[str]) -> None:
    for line in lines:
        output.out.print(line, highlight=False, markup=False)
