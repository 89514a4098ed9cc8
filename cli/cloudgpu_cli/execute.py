"""`cloudgpu exec LEASE -- CMD...`: one command in a running lease's container through
POST /api/v1/leases/{id}/exec/, its output printed and its exit code ours."""

from __future__ import annotations

import sys

import click

from cloudgpu_cli import output
from cloudgpu_cli.common import connect, json_option
from cloudgpu_cli.errors import EXIT_CODES_HELP, FAILED, USAGE, CliError

# The hub answers when the command is done: wait its timeout and then some for the reply.
ANSWER_MARGIN_S = 30.0


def after_dashes(args: tuple[str, ...]) -> tuple[str, ...]:
    """The arguments without the `--` that ends cloudgpu's own: click keeps it once it stops
    parsing options at the lease id."""
    return args[1:] if args[:1] == ("--",) else args


@click.command(
    "exec",
    # Everything after LEASE is the command's, dashes included: `exec L -- ls -la`.
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    epilog=EXIT_CODES_HELP,
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.IntRange(1, 3600),
    default=60,
    show_default=True,
    help="Seconds before the hub ends the command.",
)
@json_option
@click.argument("lease_id")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def execute(lease_id: str, command: tuple[str, ...], timeout_s: int, as_json: bool) -> None:
    """Run a command in a running lease and exit with its exit code.

    COMMAND runs in the container as given, no shell implied (`-- sh -c '...'` for one);
    its output is printed when it is done. Options go before LEASE_ID.
    """
    command = after_dashes(command)
    if not command:
        raise CliError("give the command after the lease: exec LEASE_ID -- CMD...", USAGE)
    with connect() as api:
        response = api.request(
            "POST",
            f"/api/v1/leases/{lease_id}/exec/",
            json={"command": list(command), "timeout_s": timeout_s},
            # 502: the host could not run it; 504: it outlived timeout_s. Both carry a body.
            accept=(502, 504),
            read_timeout_s=timeout_s + ANSWER_MARGIN_S,
        )
    try:
        body = response.json()
        text = str(body.get("output") or "")
    except (ValueError, AttributeError):
        raise CliError(f"hub error {response.status_code}: no JSON answer", FAILED) from None
    if as_json:
        output.emit_json(body)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
        if body.get("truncated"):
            output.err.print("(output cut to its last 1 MiB)")
    if response.status_code == 504:
        raise CliError(f"the command outlived --timeout {timeout_s} s and was ended", FAILED)
    code = body.get("exit_code")
    if code is None:
        raise CliError(f"the host could not run it: {body.get('error') or 'no reason'}", FAILED)
    # Exit statuses are one byte; a signal's death is reported by some runtimes as negative.
    raise SystemExit(int(code) & 0xFF)
