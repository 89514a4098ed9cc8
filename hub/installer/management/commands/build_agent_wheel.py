"""``manage.py build_agent_wheel``: build (or find) the agent wheel the hub serves."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from hub.installer.services import AgentWheelError, build_agent_wheel


class Command(BaseCommand):
    help = "Build the supplier agent wheel served at /agent/ (skipped if the tree is unchanged)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--dist-dir", help=f"default AGENT_DIST_DIR ({settings.AGENT_DIST_DIR})"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            wheel = build_agent_wheel(options["dist_dir"] or settings.AGENT_DIST_DIR)
        except AgentWheelError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{wheel.path}\nversion {wheel.version}\nsha256 {wheel.sha256}")
