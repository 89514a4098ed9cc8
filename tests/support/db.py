"""Emptying the test database the way a transactional test does, without losing the rows the
data migrations seeded (the catalogue's templates): later tests in the run expect them.

A transactional test's own flush (pytest-django's) gets the same through ``reseed_after_flush``,
connected to ``post_migrate`` for the whole run by tests/conftest.py: under xdist a worker may be
handed a transactional test before a test that reads the catalogue."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations import RunPython


def flush_and_reseed() -> None:
    call_command("flush", interactive=False, verbosity=0)
    reseed_after_flush()  # already done where the run's receiver is connected


def reseed_after_flush(using: str = "default", **_: Any) -> None:
    """A ``post_migrate`` receiver: Django's flush sends the signal (unless told not to) once
    the tables are empty; the migrate that made the database sends it with the rows there."""
    from hub.catalog.models import Template

    if using == "default" and not Template.objects.using(using).exists():
        reseed()


def reseed() -> None:
    loader = MigrationLoader(connection)
    with connection.schema_editor() as editor:
        # The hub's data migrations, in dependency order, against the current models: on empty
        # tables only the seeding ones write anything.
        for key in _hub_plan(loader):
            for operation in loader.graph.nodes[key].operations:
                if isinstance(operation, RunPython):
                    operation.code(apps, editor)


def _hub_plan(loader: MigrationLoader) -> list[tuple[str, str]]:
    plan: list[tuple[str, str]] = []
    for leaf in loader.graph.leaf_nodes():
        for key in loader.graph.forwards_plan(leaf):
            if key not in plan and loader.graph.nodes[key].__module__.startswith("hub."):
                plan.append(key)
    return plan
