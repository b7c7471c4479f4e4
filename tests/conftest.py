"""Shared test settings, and how `make test` spreads the suite over one pytest-xdist worker per core.

Fixtures that start services live next to the tests that use them.

Scheduling (`-n auto --dist loadgroup`): every test gets an `xdist_group`, and a group runs on one worker, in order.
- `serial`: tests that start a whole fleet (`e2e`), a Docker engine (the `docker_engine` fixture, tests/e2e's compose
  engine) or torchrun ranks, or that say `@pytest.mark.serial`. One engine per host and a fleet's processes sized for
  the machine: they run one at a time, on one worker, while the other workers take the rest.
- a folder whose session fixture is costly (`_FOLDER_GROUPS`: the image registry) is one group, built once.
- every other module is its own group, so a module-scoped fixture (a vLLM engine, a test repository) starts once.
Without xdist (`pytest tests/unit/...`) the groups mean nothing and everything runs in order, as before.
"""

import os
from pathlib import Path

import pytest

# Child processes started by tests (services, torchrun) must not fight over the two cores with BLAS threads.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TESTS = Path(__file__).resolve().parent
SERIAL = "serial"
_SERIAL_FIXTURES = {"docker_engine"}
_FOLDER_GROUPS = {TESTS / "integration" / "images": "images"}


def xdist_group_of(item: pytest.Item) -> str:
    """The xdist group `item` runs in (see the module docstring)."""
    if item.get_closest_marker("e2e") or item.get_closest_marker(SERIAL):
        return SERIAL
    if _SERIAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return SERIAL
    for folder, group in _FOLDER_GROUPS.items():
        if folder in item.path.parents:
            return group
    return item.nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group_of(item)))
