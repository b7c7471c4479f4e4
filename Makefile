# The two commands of the README: `make test` and `make run`. Both set up .venv from nothing first.
VENV := .venv
PY := $(VENV)/bin/python
CONFIG ?= examples/configs/grpo_swe_tiny.yaml

.PHONY: setup test test-fast run lint lock

$(VENV)/.installed: pyproject.toml requirements/cpu.txt scripts/setup.sh scripts/uv.sh
	bash scripts/setup.sh

setup: $(VENV)/.installed

# One pytest-xdist worker per core; tests/conftest.py puts what must run one at a time or share a costly fixture in one lane.
# Bytecode is written while testing even where PYTHONDONTWRITEBYTECODE is set: pytest then keeps its rewritten test
# modules, and the services the tests start keep theirs, instead of compiling them again in every process.
WORKERS ?= auto
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest -n $(WORKERS) --dist loadscope --no-loadscope-reorder

test: setup
	$(PY) -m fleet.protogen --check || $(PY) -m fleet.protogen
	$(PYTEST) tests -q --durations=50

# The edit loop: the unit tier without its slow tests (well under 2 minutes on two cores).
test-fast: setup
	$(PYTEST) tests/unit -q -m "not slow"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy launch fleet services trainer rollout buffer_client sandbox_client envs weightsync workshop

run: setup
	$(VENV)/bin/grpo-fleet up --config $(CONFIG)

# Re-resolve requirements/cpu.txt after changing pyproject's dependencies (commit the result).
lock:
	bash scripts/lock.sh
