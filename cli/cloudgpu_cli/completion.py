"""`cloudgpu completion bash|zsh|fish`: click's completion script for the shell."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

from cloudgpu_cli.errors import EXIT_CODES_HELP

COMPLETE_VAR = "_CLOUDGPU_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
WHERE = {
    "bash": 'eval "$(cloudgpu completion bash)"  # in ~/.bashrc',
    "zsh": 'eval "$(cloudgpu completion zsh)"  # in ~/.zshrc',
    "fish": "cloudgpu completion fish > ~/.config/fish/completions/cloudgpu.fish",
}


@click.command(epilog=EXIT_CODES_HELP)
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the shell completion script for SHELL.

    \b
    eval "$(cloudgpu completion bash)"   # ~/.bashrc
    eval "$(cloudgpu completion zsh)"    # ~/.zshrc
    cloudgpu completion fish > ~/.config/fish/completions/cloudgpu.fish
    """
    completer = get_completion_class(shell)
    assert completer is not None  # click ships all three
    root = ctx.find_root().command
    click.echo(completer(root, {}, "cloudgpu", COMPLETE_VAR).source())
