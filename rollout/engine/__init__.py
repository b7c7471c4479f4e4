"""Generation engines of the rollout worker: one small interface (`GenerationEngine`), two implementations.

`VllmEngine` (vLLM AsyncLLM, GPU or CPU) and `HfEngine` (transformers) are imported lazily by `make_engine`, so that
importing this package costs neither torch nor vLLM. The worker loop only sees `GenerationEngine`.
"""

from rollout.engine.base import (
    EngineUnavailableError,
    FinishReason,
    Generation,
    GenerationEngine,
    SamplingSpec,
    StaleVersionError,
    TensorSpec,
    UpdateStats,
    WeightMismatchError,
    checkpoint_weight_spec,
    validate_weights,
)
from rollout.engine.factory import make_engine

__all__ = [
    "EngineUnavailableError",
    "FinishReason",
    "Generation",
    "GenerationEngine",
    "SamplingSpec",
    "StaleVersionError",
    "TensorSpec",
    "UpdateStats",
    "WeightMismatchError",
    "checkpoint_weight_spec",
    "make_engine",
    "validate_weights",
]
