"""The suite is handed to pytest-xdist longest first (tests/support/run_order.py)."""

from __future__ import annotations

import pytest

from tests.support.run_order import HEAVIEST_MODULES, TESTS_ROOT, _weight


def _module(item: pytest.Item) -> str:
    return item.path.resolve().relative_to(TESTS_ROOT).as_posix()


def test_this_run_is_ordered_heaviest_module_first_and_each_module_whole(
    request: pytest.FixtureRequest,
) -> None:
    items = request.session.items
    modules = [_module(item) for item in items]
    # Each module's tests are together (its module fixtures are set up once per worker).
    seen: list[str] = []
    for module in modules:
        if not seen or seen[-1] != module:
            assert module not in seen, f"{module} is split in the run's order"
            seen.append(module)
    members = {m: [i for i in items if _module(i) == m] for m in seen}
    weights = [_weight(m, members[m]) for m in seen]
    assert weights == sorted(weights), list(zip(seen, weights, strict=True))


def test_the_heaviest_modules_exist() -> None:
    # A renamed module would silently lose its place at the front.
    for module in HEAVIEST_MODULES:
        assert (TESTS_ROOT / module).is_file(), module
