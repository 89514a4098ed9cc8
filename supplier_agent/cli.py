"""The ``cloudgpu-agent`` command line. Exit codes are part of the interface:
0 success, 1 error, 2 usage error (argparse's own convention)."""

from __future__ import annotations

import argparse
import platform
import sys

from supplier_agent import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cloudgpu-agent",
        description="CloudGPU supplier agent: rents out this host's GPUs through a CloudGPU hub.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser("version", help="print the agent version and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "version":
        print(f"cloudgpu-agent {__version__} (Python {platform.python_version()})")
        return 0
    return 2  # pragma: no cover - argparse rejects unknown commands before this


if __name__ == "__main__":
    sys.exit(main())
