# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: run test test-fast lint format venv clean

venv: $(STAMP)

$(STAMP): requirements/hub.txt requirements/agent.txt requirements/dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements/dev.txt -e .
	touch $(STAMP)

# `make run WEB=2`: two web processes behind nginx (python -m hub.runner serve --web 2).
run: venv
	$(BIN)/python -m hub.runner serve $(if $(WEB),--web $(WEB))

# TEST_WORKERS processes share the suite (pytest-xdist); the tests that use the machine's Docker
# engine run on two of them, by file (tests/conftest.py, _host_group).
TEST_WORKERS ?= 4

test: venv lint
	$(BIN)/python -m hub.runner exec --state .state/test -- $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The fast lane (docs/testing.md, "What `make test` runs"): unit and services tests only; no Docker,
# browser or hub processes. Same services as `make test`; no lint.
test-fast: venv
	$(BIN)/python -m hub.runner exec --state .state/test -- $(BIN)/python -m pytest -n 2 -m "(unit or services) and not docker and not slow" $(PYTEST_ARGS)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy supplier_agent hub/lib cli/cloudgpu_cli

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .state staticfiles .pytest_cache .ruff_cache

# Every benchmark figure (docs/benchmarks.md): embedded Postgres and Redis unless
# DATABASE_URL / REDIS_URL are set. BENCH_ARGS=--quick for a short run.
.PHONY: bench
bench: venv
	$(BIN)/python -m hub.runner exec --state .state/bench -- $(BIN)/python -m bench $(BENCH_ARGS)
