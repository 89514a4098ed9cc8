"""The order the suite is handed to pytest-xdist in: longest work first.

`--dist loadgroup` hands out work units (an `xdist_group`, or a single test) in collection
order, after moving the groups with the most tests to the front. A long single test collected
late starts late and becomes the run's tail: the compose test (about 4 minutes from a fresh
machine) used to start after 12 minutes on one worker while the other three had finished.
Sorting whole modules by their expected weight (longest first, a stable sort, so each module
stays contiguous and its module-scoped fixtures are set up once per worker) lets the short
tests fill the end of the run instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS_ROOT = Path(__file__).resolve().parent.parent

# Single tests of a minute or more, longest first (`--durations` on the 2-core VM).
HEAVIEST_MODULES = (
    "e2e/test_compose.py",  # ~4 min from a fresh machine: debootstrap, image builds, the stack
    "e2e/test_rollout.py",  # 20 agents upgrading: ~3 min
    "hub/test_runner.py",  # the local trial and make run: ~3.5 min over 5 tests
    "hub/billing/test_money_rules.py",  # the property run over random histories: ~1 min
    "web/test_local_trial_terminal.py",
    "hub/api/test_schema_live.py",
)
HEAVY_MARKERS = ("e2e", "browser", "docker", "slow")


def _weight(module: str, items: list[pytest.Item]) -> int:
    if module in HEAVIEST_MODULES:
        return HEAVIEST_MODULES.index(module)
    if any(item.get_closest_marker(m) for item in items for m in HEAVY_MARKERS):
        return len(HEAVIEST_MODULES)
    return len(HEAVIEST_MODULES) + 1


def longest_first(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: whole modules by weight, collection order otherwise."""
    module_of = {id(item): item.path.resolve().relative_to(TESTS_ROOT).as_posix() for item in items}
    by_module: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_module.setdefault(module_of[id(item)], []).append(item)
    weight = {module: _weight(module, members) for module, members in by_module.items()}
    position = {id(item): n for n, item in enumerate(items)}
    # pytest-django moves a module's transactional tests after every other database test; a
    # module is kept whole at its first test's place instead (its fixtures set up once).
    first = {module: position[id(members[0])] for module, members in by_module.items()}
    items.sort(
        key=lambda item: (
            weight[module_of[id(item)]],
            first[module_of[id(item)]],
            position[id(item)],
        )
    )


# Last: after tests/conftest.py has put the lane markers on, and after pytest-django's own sort
# (database tests before transactional ones). Under xdist each worker runs what it is handed in
# the order handed, so there only this order counts.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    longest_first(items)
