"""The engine checks the whole weights identity itself: within a run epoch versions never go back; a later epoch (a
resumed trainer, whose versions restart from its checkpoint) loads whatever its version; an earlier one never does."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from rollout.engine import Generation, GenerationEngine, SamplingSpec, StaleVersionError, UpdateStats
from rollout.engine.base import StagedWeights
from workshop.tinymodel import ensure_tiny_model


class RecordingEngine(GenerationEngine):
    """The base engine's bookkeeping with a load that only records the version (no model runs)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingSpec) -> Generation:
        raise NotImplementedError

    async def _apply_update(self, version: int, items: list[tuple[str, torch.Tensor]], *, in_flight: bool,
                            reset_cache: bool, staged: StagedWeights | None = None) -> UpdateStats:
        self._served_version = version
        return UpdateStats(version=version, pause_s=0.0, load_s=0.0)


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    path = ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny-qwen2")
    spec = RecordingEngine(path)._spec
    return path, {name: torch.zeros(s.shape, dtype=getattr(torch, s.dtype)) for name, s in spec.items()}


async def test_a_later_epoch_loads_a_lower_version_and_an_earlier_one_is_refused(weights) -> None:  # type: ignore[no-untyped-def]
    path, tensors = weights
    engine = RecordingEngine(path)
    await engine.update_weights(5, tensors, in_flight=True, reset_cache=False, epoch=1)
    with pytest.raises(StaleVersionError):
        await engine.update_weights(4, tensors, in_flight=True, reset_cache=False, epoch=1)
    await engine.update_weights(2, tensors, in_flight=True, reset_cache=False, epoch=2)  # resumed from step 2
    assert engine.served_version == 2
    with pytest.raises(StaleVersionError):
        await engine.update_weights(9, tensors, in_flight=True, reset_cache=False, epoch=1)
    await engine.update_weights(2, tensors, in_flight=True, reset_cache=False, epoch=2)  # a retried push reloads
    assert engine.served_version == 2
