"""Shared test settings, and how `make test` spreads the suite over one pytest-xdist worker per core.

Fixtures that start services live next to the tests that use them.

Scheduling (`-n auto --dist loadgroup --no-loadscope-reorder`): every test gets an `xdist_group`; a group runs on one
worker, in order, and groups are handed out in collection order (tests/e2e first, so the longest lanes start first).
- `serial`: tests that start a whole fleet on this host (`e2e`) or say `@pytest.mark.serial`: a fleet's processes are
  sized for the machine, so they run one at a time, on one worker, while the other workers take the rest.
- `docker`: everything that needs the Docker engine (the `docker_engine` fixture, tests/e2e/test_compose.py), one
  engine per host that the first user starts and stops, and the image tests, whose session registry
  (tests/integration/images/conftest.py) the Docker runtime tests use too: built once.
- every other module is its own group, so a module-scoped fixture (a vLLM engine, a test repository) starts once.
Without xdist (`pytest tests/unit/...`) the groups mean nothing and everything runs in order, as before.
Without xdist (`pytest tests/unit/...`) the groups mean nothing and everything runs in order, as before.
"""

import os
from pathlib import Path

import pytest

# Child processes started by tests (services, torchrun) must not fight over the two cores with BLAS threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TESTS = Path(__file__).resolve().parent
SERIAL, DOCKER = "serial", "docker"
_DOCKER_FIXTURES = {"docker_engine"}
_FOLDER_GROUPS = {TESTS / "integration" / "images": DOCKER}


def xdist_group_of(item: pytest.Item) -> str:
    """The xdist group `item` runs in (see the module docstring)."""
    if _DOCKER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return DOCKER
    if item.get_closest_marker("e2e") or item.get_closest_marker(SERIAL):
        return SERIAL
    for folder, group in _FOLDER_GROUPS.items():
        if folder in item.path.parents:
            return group
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))
