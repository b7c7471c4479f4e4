"""The generation-engine contract shared by the vLLM and transformers implementations.

What a `Generation` promises, for every engine:
- `logprobs[i]` is the raw model log-probability of `token_ids[i]`: log_softmax, in float32, of the unmodified logits
  (before temperature, top-k/top-p, penalties), i.e. exactly what the trainer recomputes with a plain forward pass
  of the same weights. It is NOT the log-probability under the (tempered, truncated) sampling distribution.
- `token_versions[i]` is the weight version whose forward pass produced the logits `token_ids[i]` was sampled from.
  A token sampled before an update's load started carries the old version; one sampled after the load carries the
  new version (whether or not its keys/values of earlier positions were recomputed: see `update_weights`).

`update_weights` validates the whole tensor set against `weight_spec()` before it touches the engine, so a bad push
changes nothing. This module imports neither torch nor vLLM: the worker's control plane can import it cheaply.
"""

from __future__ import annotations

import asyncio
import json
import struct
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from services.runtime.errors import FailedPrecondition, InvalidArgument, Unavailable

if TYPE_CHECKING:
    import torch

FinishReason = Literal["stop", "length", "abort"]


class WeightMismatchError(InvalidArgument):
    """A pushed tensor set does not match the served model (names, shapes or dtypes). Nothing was loaded."""


class StaleVersionError(FailedPrecondition):
    """A pushed version is older than the one served. Nothing was loaded."""


class EngineUnavailableError(Unavailable):
    """The engine is not started, is stopped, or failed (e.g. a weight load that raised half way)."""


class TensorSpec(NamedTuple):
    shape: tuple[int, ...]
    dtype: str
    """torch dtype name without the `torch.` prefix: "float32", "bfloat16", "float16"."""


@dataclass(frozen=True)
class SamplingSpec:
    """How one answer is sampled. Field names follow `policy.generation.*`."""

    max_new_tokens: int = 512
    temperature: float = 1.0
    """0 = greedy."""
    top_p: float = 1.0
    top_k: int | None = None
    """None (or <= 0) = off."""
    stop_strings: Sequence[str] = ()
    """Generation stops once the text contains one of these; the token completing it is kept."""
    stop_token_ids: Sequence[int] = ()
    """Extra stop tokens besides the model's EOS (the stop token is kept in the output)."""
    ignore_eos: bool = False
    seed: int | None = None
    """Per-request sampling seed (reproducible within one engine; engines differ from each other)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class Generation:
    request_id: str
    token_ids: list[int]
    logprobs: list[float]
    """Raw model log-probability (float32 log_softmax of unmodified logits) of each sampled token."""
    token_versions: list[int]
    """Weight version that produced each token."""
    finish_reason: FinishReason
    prompt_len: int = 0


def spans_to_versions(spans: Sequence[Any] | None, n: int) -> list[int]:
    """Weight-version spans (`[start, end)` with a `version`, as vLLM reports them) -> one int version per token."""
    if n == 0:
        return []
    if not spans:
        raise RuntimeError("vLLM returned no weight-version labels for a non-empty output")
    versions: list[int] = []
    for s in spans:
        if s.start != len(versions):
            raise RuntimeError(f"weight-version spans are not contiguous: {spans}")
        versions.extend([int(s.version)] * (s.end - s.start))
    if len(versions) != n:
        raise RuntimeError(f"weight-version spans cover {len(versions)} of {n} tokens")
    return versions


@dataclass(frozen=True)
class UpdateStats:
    version: int
    pause_s: float
    """Time generation made no progress because of this update (in-flight: pause→resume; otherwise: from the call
    until new requests run again, including the drain)."""
    load_s: float
    """Time spent copying the tensors into the engine."""
    drain_s: float = 0.0
    """Non-in-flight mode: time waiting for the requests in flight to finish."""
    stage_s: float = 0.0
    """Time preparing the push before generation was paused (vLLM: staging it on tmpfs, if it was not received
    there, and on CPU packing its GEMM weights into new kernels)."""
    requests_in_flight: int = 0
    """Requests that were generating when the update began (they continue in-flight, or were drained)."""
    kv_recomputed: bool = False


class StagedWeights(dict[str, "torch.Tensor"]):
    """A push's tensors (name -> tensor) in memory the engine handed out for them with `stage()`, so that the
    receiver writes the bytes exactly once, where the engine will load them from. Filled, it is passed to
    `update_weights` as is; the engine takes it over there. A push that fails before that must `release()` it."""

    def __init__(self, tensors: dict[str, torch.Tensor], owner: GenerationEngine | None = None) -> None:
        super().__init__(tensors)
        self.owner = owner
        self.consumed = False

    def tensor_received(self, i: int) -> None:
        """A receiver filled tensor `i` (in push order), and all before it: an engine may start loading them."""

    def release(self) -> None:
        """Give the memory back to the engine without loading it (idempotent; a no-op once loaded)."""
        if not self.consumed:
            self.consumed = True
            if self.owner is not None:
                self.owner._recycle(self)


@dataclass
class _Counters:
    tokens_generated: int = 0
    updates: int = 0
    total_pause_s: float = 0.0
    last: UpdateStats | None = field(default=None)


def checkpoint_weight_spec(model_path: str | Path, dtype: str) -> tuple[dict[str, TensorSpec], set[str]]:
    """Names and shapes from the safetensors headers of an HF folder (no tensor is read), with the served dtype.

    Returns (spec, aliases): for a model with tied embeddings `lm_head.weight` is not in the checkpoint, but a
    trainer's `state_dict()` carries it as a second name of `model.embed_tokens.weight`; it is accepted and ignored.
    """
    root = Path(model_path)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors under {root}")
    spec: dict[str, TensorSpec] = {}
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name != "__metadata__":
                spec[name] = TensorSpec(tuple(int(d) for d in meta["shape"]), dtype)
    config = json.loads((root / "config.json").read_text())
    aliases = {"lm_head.weight"} if config.get("tie_word_embeddings") and "lm_head.weight" not in spec else set()
    return spec, aliases


def validate_weights(
    spec: Mapping[str, TensorSpec],
    tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    aliases: Collection[str] = (),
) -> list[tuple[str, torch.Tensor]]:
    """The pushed set as a list, or WeightMismatchError naming the first bad tensor. The set must be complete: a
    partial push would leave the engine half old, half new while claiming the new version."""
    items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
    out: list[tuple[str, torch.Tensor]] = []
    seen: set[str] = set()
    for name, t in items:
        if name in seen:
            raise WeightMismatchError(f"tensor {name!r} appears twice in the push")
        seen.add(name)
        if name in aliases:
            continue  # tied to the embedding, which is pushed under its own name
        if name not in spec:
            raise WeightMismatchError(f"tensor {name!r} is not a parameter of the served model")
        want = spec[name]
        if tuple(t.shape) != want.shape:
            raise WeightMismatchError(f"tensor {name!r}: shape {list(t.shape)} != model's {list(want.shape)}")
        got = str(t.dtype).removeprefix("torch.")
        if got != want.dtype:
            raise WeightMismatchError(f"tensor {name!r}: dtype {got} != model's {want.dtype}")
        out.append((name, t))
    missing = [n for n in spec if n not in seen]
    if missing:
        raise WeightMismatchError(f"push lacks {len(missing)} of the model's tensors, first {missing[0]!r}")
    return out


class GenerationEngine(ABC):
    """One model served for generation with hot-swappable weights. `start()` before use, `stop()` at the end.

    Implementations provide `start`, `stop`, `generate` and `_apply_update`; this class owns the checks and the
    version bookkeeping, so that both engines refuse the same pushes with the same errors. The errors subclass
    `services.runtime.errors` (WeightMismatchError -> INVALID_ARGUMENT, StaleVersionError -> FAILED_PRECONDITION,
    EngineUnavailableError -> UNAVAILABLE), so the error interceptor maps them without a wrapper.
    """

    name: str = "engine"

    def __init__(self, model_path: str | Path, *, dtype: str = "float32", initial_version: int = 0) -> None:
        self.model_path = Path(model_path)
        self.dtype = dtype
        self._served_version = initial_version
        # The run epoch of the served weights; 0 before any push (run epochs start at 1). The served identity is
        # (epoch, version): within an epoch versions only grow, a later epoch (a resumed trainer) may restart them.
        self._served_epoch = 0
        self._spec, self._aliases = checkpoint_weight_spec(self.model_path, dtype)
        self._update_lock = asyncio.Lock()
        self._counters = _Counters()

    # -- lifecycle ----------------------------------------------------------------------------------------------
    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def stop(self) -> None: ...

    # -- generation ---------------------------------------------------------------------------------------------
    @abstractmethod
    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingSpec,
                       images: Sequence[bytes] = ()) -> Generation:
        """Sample one answer. Cancelling the awaiting task aborts the request. `images` (computer use): the PNGs of
        the prompt's image placeholder runs, in order; each run is already expanded to its tokens in the prompt."""

    def failure(self) -> str | None:
        """Why this engine can no longer serve (its engine process died, a weight load broke it), or None. A worker
        whose engine failed exits (`RolloutWorker.engine_watch`) rather than fail every group it leases."""
        return None

    @property
    def served_version(self) -> int:
        return self._served_version

    @property
    def tokens_generated(self) -> int:
        return self._counters.tokens_generated

    @property
    def last_update(self) -> UpdateStats | None:
        return self._counters.last

    def figures(self) -> dict[str, float]:
        """Engine-specific counters for the worker's summary (forwards, CUDA graph captures, phase seconds); none
        by default."""
        return {}

    @property
    def total_pause_s(self) -> float:
        return self._counters.total_pause_s

    # -- weights ------------------------------------------------------------------------------------------------
    def weight_spec(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """HF checkpoint name -> (shape, dtype name) of every tensor a push must carry."""
        return {k: (v.shape, v.dtype) for k, v in self._spec.items()}

    def stage(self, metas: Sequence[tuple[str, tuple[int, ...], str]]) -> StagedWeights:
        """Memory to receive a push into: (name, shape, dtype name) in the order the bytes come. The base engine
        gives fresh CPU tensors; engines override it to hand out memory they can load from without another copy.
        Not validated here: `update_weights` does that, before anything is loaded."""
        import torch

        return StagedWeights({name: torch.empty(shape, dtype=getattr(torch, dtype)) for name, shape, dtype in metas})

    async def on_staged(self, staged: StagedWeights) -> None:
        """Called by a receiver once `staged` is handed out, before its bytes arrive (default: nothing to start)."""
        return None

    def _recycle(self, staged: StagedWeights) -> None:
        """Take back staging memory that was released unused (see `stage`). The base engine's is plain memory."""
        staged.clear()

    async def update_weights(
        self,
        version: int,
        tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
        *,
        in_flight: bool,
        reset_cache: bool,
        epoch: int = 0,
    ) -> UpdateStats:
        """Serve `tensors` as `version`.

        in_flight=True: requests in flight are paused between two forward passes, the weights are swapped, and
        they continue; their later tokens carry `version`. in_flight=False: new requests wait, requests in flight
        finish with the old weights, then the load happens.
        reset_cache=True: no token after the load is computed against keys/values from older weights: the requests
        in flight have their KV recomputed from prompt + tokens generated so far, and cached prefixes are dropped.
        reset_cache=False: requests in flight keep the KV they have (old-weight keys/values for earlier
        positions); cached prefixes of older weights are still never reused by requests started after the update.
        Weights older than the served (epoch, version) are refused: a later run `epoch` may restart versions lower
        (callers that know no epochs leave it 0: versions must not go back); the same weights are reloaded (pushes
        are retried).
        `tensors` from this engine's `stage()` are taken over: loaded from where they lie (or swapped in), and
        released whatever the outcome.
        """
        staged = tensors if isinstance(tensors, StagedWeights) and tensors.owner is self else None
        try:
            items = validate_weights(self._spec, tensors, self._aliases)
            async with self._update_lock:
                if (epoch, version) < (self._served_epoch, self._served_version):
                    raise StaleVersionError(
                        f"weight version {version} is older than the served {self._served_version}")
                stats = await self._apply_update(version, items, in_flight=in_flight, reset_cache=reset_cache,
                                                 staged=staged)
                self._served_epoch = epoch
                self._counters.updates += 1
                self._counters.total_pause_s += stats.pause_s
                self._counters.last = stats
                return stats
        finally:
            if staged is not None:
                staged.release()

    @abstractmethod
    async def _apply_update(
        self, version: int, items: list[tuple[str, torch.Tensor]], *, in_flight: bool, reset_cache: bool,
        staged: StagedWeights | None = None,
    ) -> UpdateStats:
        """Load validated tensors and set `_served_version` (exactly when tokens start to come from them). `staged`:
        the same tensors as this engine's own staging memory (mark it `consumed` if it is kept)."""
