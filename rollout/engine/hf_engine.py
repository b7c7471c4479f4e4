"""`HfEngine`: transformers generation with a KV cache, for machines without vLLM (CPU or CUDA).

One background task owns the model. Each round it advances every active request by one token (prefill, or one
decode step against that request's own `DynamicCache`), under `_step_lock`; a weight update takes the same lock, so
weights never change inside a forward pass, and the version stamped on a token is the one whose forward produced
it. Requests are stepped one after another rather than padded into a batch: with requests joining and leaving at
every step, per-request caches keep the code obviously correct, and on CPU the tiny model is overhead-bound anyway.

Log-probs are `log_softmax(logits.float())` of the unmodified logits, the same quantity vLLM returns in
`raw_logprobs` mode and the trainer recomputes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.engine.base import (
    EngineUnavailableError,
    FinishReason,
    Generation,
    GenerationEngine,
    SamplingSpec,
    StagedWeights,
    UpdateStats,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


def _spare_key(name: str, t: torch.Tensor) -> tuple[str, tuple[int, ...], str]:
    """How `HfEngine.stage` finds a spare tensor for an announced (name, shape, dtype name)."""
    return name, tuple(t.shape), str(t.dtype).removeprefix("torch.")


def sample_next(logits: torch.Tensor, spec: SamplingSpec, generator: torch.Generator | None) -> tuple[int, float]:
    """(token, raw log-prob) from one position's logits. Temperature/top-k/top-p shape only the sampling
    distribution; the returned log-prob is always of the raw logits (see module docstring)."""
    import torch

    logits = logits.float()
    raw = torch.log_softmax(logits, dim=-1)
    if spec.temperature == 0:
        tok = int(torch.argmax(logits))
        return tok, float(raw[tok])
    x = logits / spec.temperature
    if spec.top_k and 0 < spec.top_k < x.numel():
        kth = torch.topk(x, spec.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if spec.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Drop a token when the mass before it already reaches top_p; the most likely token always stays.
        drop = (torch.cumsum(probs, dim=-1) - probs) >= spec.top_p
        x = x.scatter(0, order[drop], float("-inf"))
    tok = int(torch.multinomial(torch.softmax(x, dim=-1), 1, generator=generator))
    return tok, float(raw[tok])


@dataclass
class _Request:
    rid: str
    prompt: list[int]
    spec: SamplingSpec
    max_tokens: int
    generator: Any
    done: asyncio.Future[Generation]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    cache: Any = None
    """The sequential engine: transformers DynamicCache of prompt + tokens[:-1]; the batched engine: True once its
    slot holds them. None = (re)compute it from prompt + tokens."""
    slot: int | None = None
    """The batched engine: the KV-cache row this request owns (None: waiting for one)."""
    seed: int = 0
    """The request's sampling stream (the batched engine draws token i's uniform from (seed, i))."""
    finish: FinishReason | None = None
    error: BaseException | None = None


class HfEngine(GenerationEngine):
    name = "hf"

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "float32",
        device: str = "auto",
        tokenizer: str | None = None,
        max_model_len: int = 2048,
        seed: int = 0,
        initial_version: int = 0,
    ) -> None:
        super().__init__(model_path, dtype=dtype, initial_version=initial_version)
        self.max_model_len = max_model_len
        self._device_choice = device
        self._tokenizer_path = tokenizer or str(self.model_path)
        self._seed = seed
        self._ids = itertools.count()
        self._model: Any = None
        self.device: Any = None  # torch.device, chosen at start()
        self._tokenizer: Any = None
        self._eos: set[int] = set()
        self._requests: dict[str, _Request] = {}
        self._step_lock = asyncio.Lock()
        self._accepting = asyncio.Event()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._loop_task: asyncio.Task[None] | None = None
        self._stepping: asyncio.Future[None] | None = None
        self._failed: BaseException | None = None
        # (name, shape, dtype) -> a tensor to receive the next push into. On CPU a push is swapped in: the
        # parameters take the received storage and their old storage becomes the spare (two copies of the weights
        # held, no copy per push). On CUDA the spare is pinned host memory that pushes are copied in from.
        self._spare: dict[tuple[str, tuple[int, ...], str], torch.Tensor] = {}

    # -- lifecycle ----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        t0 = time.perf_counter()
        await asyncio.to_thread(self._load)
        self._loop_task = asyncio.create_task(self._decode_loop(), name="hf-engine-decode")
        self._accepting.set()
        log.info(
            "HF engine up in %.1f s (%s on %s, %s)", time.perf_counter() - t0, self.model_path, self.device, self.dtype
        )

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from fleet.tokenizer import load_tokenizer

        choice = self._device_choice
        if choice == "auto":
            choice = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(choice)
        model: Any = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=getattr(torch, self.dtype))
        self._model = model.to(self.device).eval()
        self._tokenizer = load_tokenizer(self._tokenizer_path)
        # Same stop set as vLLM: the tokenizer's EOS plus generation_config.json's eos_token_id(s).
        eos = {self._tokenizer.eos_token_id}
        gen_cfg = self.model_path / "generation_config.json"
        if gen_cfg.is_file():
            e = json.loads(gen_cfg.read_text()).get("eos_token_id")
            eos |= set(e) if isinstance(e, list) else {e}
        self._eos = {int(i) for i in eos if i is not None}
        params = self._model.state_dict(keep_vars=True)
        for name, ts in self._spec.items():
            if name not in params or tuple(params[name].shape) != ts.shape:
                raise RuntimeError(f"checkpoint tensor {name!r} has no matching parameter in the transformers model")
        self._params = {name: params[name] for name in self._spec}
        if self.device.type == "cpu":
            # Pushes are received into the spare and swapped in, so both sets end up written by receives. Both are
            # anonymous memory with every page present: transformers may leave parameters mapped from the
            # checkpoint file, where the first write to each page is a copy-on-write fault (a push into them took
            # 8 s instead of 1 s for 0.5B here).
            with torch.no_grad():
                for p in self._params.values():
                    p.data = p.data.clone()
            self._spare = {_spare_key(name, p.data): torch.zeros_like(p.data) for name, p in self._params.items()}
        elif self.device.type == "cuda":  # pushes land in pinned host memory, reused, and are copied in from there
            self._spare = {_spare_key(name, p.data): torch.empty(p.shape, dtype=p.dtype, pin_memory=True)
                           for name, p in self._params.items()}

    def failure(self) -> str | None:
        return f"HF engine decode loop died: {self._failed!r}" if self._failed is not None else None

    async def stop(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._stepping is not None:
            await asyncio.gather(self._stepping, return_exceptions=True)
        for req in self._requests.values():
            if not req.done.done():
                req.done.set_exception(EngineUnavailableError("HF engine stopped"))
        self._requests.clear()
        self._accepting.set()
        self._model = None
        self._spare.clear()

    # -- generation ---------------------------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt_token_ids: Sequence[int], sampling: SamplingSpec,
                       images: Sequence[bytes] = ()) -> Generation:
        import torch

        if images:  # the config refuses this pairing at load (fleet/config/vision.py); a direct caller learns why
            raise ValueError("the hf engine has no image inputs: the computer-use path needs the vllm engine")

        prompt = list(prompt_token_ids)
        if not 0 < len(prompt) < self.max_model_len:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit max_model_len={self.max_model_len}")
        await self._accepting.wait()
        if self._failed is not None or self._loop_task is None:
            raise EngineUnavailableError(f"HF engine is not serving (failed: {self._failed!r})")
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in flight")
        seed = sampling.seed if sampling.seed is not None else self._seed * 1_000_003 + next(self._ids)
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        req = _Request(
            rid=request_id, prompt=prompt, spec=sampling, generator=gen, seed=seed,
            max_tokens=min(sampling.max_new_tokens, self.max_model_len - len(prompt)),
            done=asyncio.get_running_loop().create_future(),
        )  # fmt: skip
        self._requests[request_id] = req
        self._idle.clear()
        self._wake.set()
        try:
            return await req.done
        finally:
            # Cancelled by the caller (or finished): the decode loop drops it at its next round.
            self._requests.pop(request_id, None)
            if not self._requests:
                self._idle.set()

    async def _decode_loop(self) -> None:
        try:
            await self._decode_rounds()
        except Exception as exc:  # a dead loop must fail every caller loudly, not leave them waiting forever
            log.exception("HF engine decode loop died")
            self._failed = exc
            for req in self._requests.values():
                if not req.done.done():
                    req.done.set_exception(EngineUnavailableError(f"HF engine decode loop died: {exc!r}"))
            raise

    async def _decode_rounds(self) -> None:
        while True:
            if not self._requests:
                self._wake.clear()
                await self._wake.wait()
                continue
            async with self._step_lock:
                batch = list(self._requests.values())
                # Shielded: a cancelled loop (stop()) leaves the thread's step running; stop() waits for it before
                # it drops the model, so no step ever runs against a half-torn-down engine.
                self._stepping = asyncio.ensure_future(asyncio.to_thread(self._step_all, batch, self._served_version))
                await asyncio.shield(self._stepping)
            for req in batch:
                if req.done.done():
                    continue
                if req.error is not None:
                    req.done.set_exception(req.error)
                elif req.finish is not None:
                    req.done.set_result(
                        Generation(req.rid, req.tokens, req.logprobs, req.versions, req.finish, len(req.prompt))
                    )
            await asyncio.sleep(0)  # let generate() callers and updates run between rounds

    def _step_all(self, batch: list[_Request], version: int) -> None:
        import torch

        with torch.inference_mode():
            for req in batch:
                if req.done.done():
                    continue
                try:
                    self._step_one(req, version)
                except Exception as exc:  # one bad request (e.g. OOM on a long prompt) must not stop the others
                    log.exception("request %s failed", req.rid)
                    req.error = exc

    def _step_one(self, req: _Request, version: int) -> None:
        import torch

        if req.cache is None:
            ids = req.prompt + req.tokens
        else:
            ids = req.tokens[-1:]
        x = torch.tensor([ids], device=self.device)
        out = self._model(input_ids=x, past_key_values=req.cache, use_cache=True)
        req.cache = out.past_key_values
        tok, lp = sample_next(out.logits[0, -1], req.spec, req.generator)
        req.tokens.append(tok)
        req.logprobs.append(lp)
        req.versions.append(version)
        self._counters.tokens_generated += 1
        req.finish = self._finish_reason(req)

    def _finish_reason(self, req: _Request) -> FinishReason | None:
        tok, s = req.tokens[-1], req.spec
        if (tok in self._eos and not s.ignore_eos) or tok in s.stop_token_ids:
            return "stop"
        if s.stop_strings:
            # Only the tail can hold a newly completed stop string (the text before it was checked already).
            window = max(len(x) for x in s.stop_strings) + 4
            tail = self._tokenizer.decode(req.tokens[-window:], skip_special_tokens=True)
            if any(x in tail for x in s.stop_strings):
                return "stop"
        if len(req.tokens) >= req.max_tokens:
            return "length"
        return None

    # -- weights ------------------------------------------------------------------------------------------------
    def stage(self, metas: Sequence[tuple[str, tuple[int, ...], str]]) -> StagedWeights:
        import torch

        out: dict[str, torch.Tensor] = {}
        for name, shape, dtype in metas:
            spare = self._spare.pop((name, tuple(shape), dtype), None)
            out[name] = spare if spare is not None else torch.empty(shape, dtype=getattr(torch, dtype))
        return StagedWeights(out, owner=self)

    def _recycle(self, staged: StagedWeights) -> None:
        for name, t in staged.items():
            self._spare[_spare_key(name, t)] = t

    async def _apply_update(
        self, version: int, items: list[tuple[str, torch.Tensor]], *, in_flight: bool, reset_cache: bool,
        staged: StagedWeights | None = None,
    ) -> UpdateStats:
        if self._failed is not None or self._model is None:
            raise EngineUnavailableError("HF engine is not serving")
        self._accepting.clear()
        try:
            n_active = len(self._requests)
            t0 = time.perf_counter()
            if not in_flight:
                await self._idle.wait()
            t_drained = time.perf_counter()
            async with self._step_lock:  # the round in progress ends first: no forward pass sees mixed weights
                t1 = time.perf_counter()
                try:
                    if staged is not None and self.device.type == "cpu":
                        self._swap_in(items, staged)
                    else:
                        await asyncio.to_thread(self._copy_in, items)
                except BaseException as exc:
                    self._failed = exc
                    for req in self._requests.values():
                        if not req.done.done():
                            req.done.set_exception(EngineUnavailableError(f"weight load failed: {exc!r}"))
                    raise EngineUnavailableError(f"weight load of version {version} failed: {exc!r}") from exc
                t2 = time.perf_counter()
                if reset_cache:
                    for req in self._requests.values():
                        req.cache = None  # next round re-runs prompt + tokens so far through the new weights
                self._served_version = version
            t3 = time.perf_counter()
        finally:
            self._accepting.set()
        return UpdateStats(
            version=version,
            pause_s=t3 - t0,
            load_s=t2 - t1,
            drain_s=t_drained - t0,
            requests_in_flight=n_active,
            kv_recomputed=reset_cache and in_flight,
        )

    def _swap_in(self, items: list[tuple[str, torch.Tensor]], staged: StagedWeights) -> None:
        """Point the parameters at the received tensors (a pointer swap per tensor, no byte moved); their old
        storage becomes the spare that the next push is received into."""
        old = {}
        for name, t in items:
            p = self._params[name]
            old[name] = p.data
            p.data = t
        staged.consumed = True
        for name, t in staged.items():  # tensors not swapped in (a tied head's alias) stay spare as they are
            self._spare[_spare_key(name, t)] = old.get(name, t)

    def _copy_in(self, items: list[tuple[str, torch.Tensor]]) -> None:
        """Copy the pushed tensors into the live parameters (no forward pass runs meanwhile: the caller holds the
        step lock). On CPU the copy runs on this one thread: a copy is memory-bound, and splitting it over the
        intra-op pool only adds synchronisation, which on a loaded machine made it 3-10x slower (measured on the
        shared 2-core box: 14.7 MB in 0.17 s median with 2 threads, 0.016 s with 1)."""
        import torch

        cpu = self.device.type == "cpu"
        threads = torch.get_num_threads()
        if cpu:
            torch.set_num_threads(1)
        try:
            with torch.no_grad():
                for name, t in items:
                    self._params[name].copy_(t, non_blocking=True)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
        finally:
            if cpu:
                torch.set_num_threads(threads)
