# The two commands of the README: `make test` and `make run`. Both set up .venv from nothing first.
VENV := .venv
PY := $(VENV)/bin/python
CONFIG ?= examples/configs/grpo_swe_tiny.yaml

.PHONY: setup test test-fast run lint lock

$(VENV)/.installed: pyproject.toml requirements/cpu.txt scripts/setup.sh scripts/uv.sh
	bash scripts/setup.sh

setup: $(VENV)/.installed

test: setup
	$(PY) -m fleet.protogen --check || $(PY) -m fleet.protogen
	$(PY) -m pytest tests -q

test-fast: setup
	$(PY) -m pytest tests -q -m "not slow"

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy launch fleet services trainer rollout buffer_client sandbox_client envs weightsync

run: setup
	$(VENV)/bin/grpo-fleet up --config $(CONFIG)

# Re-resolve requirements/cpu.txt after changing pyproject's dependencies (commit the result).
lock:
	bash scripts/lock.sh
