"""The `cloudgpu` command: the group and its commands (one module per group of them, each over
the hub's REST API, docs/api.md), and the one place failures become a line and an exit code."""

from __future__ import annotations

import sys

import click

from cloudgpu_cli import account, leases, offers, renting, volumes
from cloudgpu_cli.completion import completion
from cloudgpu_cli.errors import EXIT_CODES_HELP, INTERRUPTED, OK, USAGE, CliError
from cloudgpu_cli.execute import execute
from cloudgpu_cli.ssh import ssh
from cloudgpu_cli.terminal import terminal


@click.group(epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """Rent GPUs on a CloudGPU hub from your terminal.

    Log in once with an API token from the dashboard's API tokens page; CLOUDGPU_HUB and
    CLOUDGPU_TOKEN override the stored hub and token, CLOUDGPU_TIMEOUT the 30 s the CLI
    waits for an answer.
    """


for command in (
    account.login,
    account.logout,
    offers.offers,
    offers.templates,
    renting.rent,
    leases.ls,
    leases.show,
    leases.logs,
    execute,
    terminal,
    ssh,
    leases.stop,
    volumes.volumes,
    account.balance,
    account.topup,
    account.keys,
    completion,
):
    cli.add_command(command)


def run(entry: click.Command, args: list[str] | None = None) -> int:
    """Run click without its own exit handling, so every failure is one line and a code."""
    try:
        entry.main(args=args, prog_name="cloudgpu", standalone_mode=False)
    except CliError as exc:
        # Plain, not rich: rich wraps at the console width, and this must stay one line.
        click.echo(f"cloudgpu: {' '.join(exc.message.split())}", err=True)
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
