"""Fixtures of the trainer's integration tests (the harness itself is in trainer_harness.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from trainer_harness import FakeRollout, replay_buffer_factory


@pytest.fixture
def replay_buffer() -> Iterator[Any]:
    """start(config_path) -> address; the process is terminated (SIGTERM, then SIGKILL) at teardown."""
    yield from replay_buffer_factory()


@pytest.fixture
def fake_rollout() -> Iterator[Any]:
    made: list[FakeRollout] = []

    def make(buffer_address: str, model_path: str, **kw: Any) -> FakeRollout:
        w = FakeRollout(buffer_address, model_path, **kw).start()
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop()


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from workshop.resolve import resolve_model

    return resolve_model("tiny-qwen2")
