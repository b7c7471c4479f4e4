"""`BatchedHfEngine`: the transformers engine with every active request in one forward per decode step.

The sequential `HfEngine` steps requests one after another, each with its own `DynamicCache`: on a GPU that is one
kernel launch train per token per request, and 256 requests of a 0.5B model ran at 43 tokens/s on an H200. Here the
requests share a `SlotKVCache` (one row per request, each at its own position), so a round of the decode loop is:

1. requests that have no KV yet (new, or reset by a weight update with `reset_cache`) take a free slot and are
   prefilled together: right-padded batches of at most `max_prefill_tokens`, causal attention among the new tokens,
   and the first token sampled from each row's last real position;
2. every request with KV advances by up to `decode_steps` tokens, each step a single forward over rows `0..b-1`
   (`decode_steps.py`: on CUDA a captured graph per shape; a step feeds the next on the device, so the host writes
   a round's inputs once and reads its tokens once). A request that stops inside a round (EOS, stop string, budget)
   keeps its row until the round ends; the tokens past its stop are dropped. The round's steps are launched before
   its prefill, so on a GPU they run while the host launches the prefill's kernels.

Requests join and leave between rounds; a slot is given back as soon as its request is done or cancelled. The
lifecycle, the step lock, weight updates (in flight, drained, with or without KV recompute) and version stamping are
`HfEngine`'s, unchanged: a weight push copies into the same parameter tensors, so captured graphs stay valid.

What transformers' own batching offers, and why it is not the base here: `generate` on a padded batch needs every
request to start and stop together; `generate_batch` (continuous batching, paged cache) measured 0.6-1.0k tokens/s on
the H200 for the shapes below against 22k for a static cache, and exposes neither the raw log-probs of unmodified
logits per token nor a way to swap weights between two steps. The model's own forward, its attention kernels (SDPA)
and its parameters are used as they are; only the cache and the step are ours.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rollout.engine.batch_sampling import sample_rows, seeded_uniforms
from rollout.engine.decode_steps import IDS, POS, TEMP, TOPP, UNIF, DecodeSteps, fill_idle_rows
from rollout.engine.hf_engine import HfEngine, _Request

if TYPE_CHECKING:
    import torch

    from rollout.engine.slot_cache import SlotKVCache

log = logging.getLogger(__name__)


def _bucket(n: int, cap: int, smallest: int) -> int:
    """The smallest power of two >= n (at least `smallest`), or `cap` past it: the shapes graphs are captured for."""
    b = smallest
    while b < n:
        b *= 2
    return min(b, cap)


class BatchedHfEngine(HfEngine):
    name = "hf-batched"

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
        max_num_seqs: int = 256,
        max_prefill_tokens: int = 16384,
        kv_cache_gb: float | None = None,
        cuda_graphs: bool = True,
        prefill_wait_steps: int = 8,
        decode_steps: int = 8,
    ) -> None:
        super().__init__(model_path, dtype=dtype, device=device, tokenizer=tokenizer, max_model_len=max_model_len,
                         seed=seed, initial_version=initial_version)
        self.max_num_seqs = max_num_seqs
        self.max_prefill_tokens = max_prefill_tokens
        self._kv_cache_gb = kv_cache_gb
        self._want_graphs = cuda_graphs
        if decode_steps < 1:
            raise ValueError(f"policy.generation.hf_cfg.decode_steps must be >= 1 (got {decode_steps})")
        self.prefill_wait_steps = prefill_wait_steps
        self.decode_steps = decode_steps
        self._waited = 0  # decode steps the requests waiting for a prefill have waited
        self._cache: SlotKVCache | None = None
        self._base: Any = None
        self._head: Any = None
        self._free: list[int] = []
        self._owner: dict[int, _Request] = {}
        self._steps: DecodeSteps | None = None
        self.rows = 0
        self.forwards = {"prefill": 0, "decode": 0, "decode_rounds": 0, "graph_captures": 0}
        # Where a round's time goes (seconds, summed): prefill forwards; decode's host-side input writing, its
        # steps (graph replays or eager forwards, until the tokens are on the host), and its bookkeeping of them.
        self.timings = {"prefill_s": 0.0, "decode_prep_s": 0.0, "decode_forward_s": 0.0, "decode_record_s": 0.0}
        self._launched = 0  # decode steps launched and not yet read
        self.overlap_prefill = True  # False: prefill, then decode (the order before; kept to measure the gain)

    def figures(self) -> dict[str, float]:
        """Forwards (prefill, decode steps and rounds, CUDA graphs captured: one per new shape) and where their time
        went (`timings`): a first validation round that captures graphs for its shapes shows here."""
        return {**{k: float(v) for k, v in self.forwards.items()}, **{k: round(v, 3) for k, v in self.timings.items()}}

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def _load(self) -> None:
        import torch

        from rollout.engine.slot_cache import SlotKVCache, use_slot_attention

        super()._load()
        model, cfg = self._model, self._model.config
        use_slot_attention(model)  # SDPA over the slots' per-row mask, with grouped-query heads read, not copied
        if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ["full_attention"]):
            raise ValueError(f"{self.model_path}: sliding-window layers are not supported by the batched hf engine "
                             "(policy.generation.hf_cfg.batching=sequential serves them)")
        if getattr(cfg, "final_logit_softcapping", None):
            raise ValueError(f"{self.model_path}: logit soft-capping is not supported by the batched hf engine")
        self._base, self._head = model.get_decoder(), model.get_output_embeddings()
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        dt = getattr(torch, self.dtype)
        per_token = SlotKVCache.bytes_per_token(layers=cfg.num_hidden_layers, kv_heads=kv_heads, head_dim=head_dim,
                                                dtype=dt)
        budget = self._kv_cache_gb * 2**30 if self._kv_cache_gb else self._default_kv_bytes()
        self.rows = min(self.max_num_seqs, int(budget // (per_token * self.max_model_len)))
        if self.rows < 1:
            raise ValueError(
                f"policy.generation.hf_cfg.kv_cache_gb: {budget / 2**30:.2f} GB holds no sequence of max_model_len="
                f"{self.max_model_len} ({per_token * self.max_model_len / 2**30:.2f} GB each)")
        self._cache = SlotKVCache(layers=cfg.num_hidden_layers, rows=self.rows, kv_heads=kv_heads,
                                  head_dim=head_dim, max_len=self.max_model_len, dtype=dt, device=self.device)
        self._free = list(range(self.rows))
        self._steps = DecodeSteps(base=self._base, head=self._head, cache=self._cache, rows=self.rows,
                                  max_len=self.max_model_len, steps=self.decode_steps, device=self.device,
                                  graphs=self._want_graphs)
        self._prefill_host = torch.zeros(4, self.rows, dtype=torch.float32, pin_memory=self.device.type == "cuda")
        # Per slot, set when a request takes it: its sampling stream and parameters (decode writes them as arrays).
        self._slot_seed = np.zeros(self.rows, dtype=np.uint64)
        self._slot_params = np.zeros((3, self.rows), dtype=np.float32)  # temperature, top_k, top_p
        log.info("batched hf engine: %d slots x %d tokens (%.2f GB KV cache), CUDA graphs %s", self.rows,
                 self.max_model_len, self.rows * self.max_model_len * per_token / 2**30,
                 "on" if self._steps.graphs_on else "off")

    def _default_kv_bytes(self) -> float:
        import torch

        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return 0.4 * free
        return 2.0 * 2**30

    async def stop(self) -> None:
        await super().stop()
        self._owner.clear()
        self._cache = self._base = self._head = self._steps = None

    # -- one round ----------------------------------------------------------------------------------------------
    def _step_all(self, batch: list[_Request], version: int) -> None:
        import torch

        live = self._release_slots(batch)
        for r in live:
            if r.slot is None and self._free:  # the lowest free slot keeps the decode batch's rows packed
                r.slot = heapq.heappop(self._free)
                r.cache = None
                self._owner[r.slot] = r
                s = r.spec
                self._slot_seed[r.slot] = r.seed & 0xFFFFFFFFFFFFFFFF
                self._slot_params[:, r.slot] = (s.temperature, s.top_k if s.top_k and s.top_k > 0 else 0, s.top_p)
        with torch.inference_mode():
            decoding = [r for r in live if r.slot is not None and r.cache is not None]
            prefilling = [r for r in live if r.slot is not None and r.cache is None]
            steps = self.decode_steps
            if prefilling and decoding and not self._prefill_due(prefilling):
                prefilling = []
                steps = max(1, min(steps, self.prefill_wait_steps - self._waited))  # the wait's bound holds
                self._waited += steps
            # The decode steps are launched first and the prefill after them: on a GPU the steps run while the host
            # launches the prefill's kernels (a prefill forward is bound by its launches, the steps by the device).
            launched = False
            if decoding and self.overlap_prefill:
                launched = self._guarded(self._launch_decode, decoding, version, steps)
            if prefilling:
                self._waited = 0
                t0 = time.perf_counter()
                self._guarded(self._prefill, prefilling, version)
                self.timings["prefill_s"] += time.perf_counter() - t0
            if decoding and not self.overlap_prefill:
                launched = self._guarded(self._launch_decode, decoding, version, steps)
            if launched:
                self._guarded(self._finish_decode, decoding, version)
        self._release_slots(live)

    def _prefill_due(self, waiting: list[_Request]) -> bool:
        """Whether to prefill now while other requests decode. A prefill forward costs about the same whatever it
        holds (on a GPU it is bound by kernel launches: 12 ms for one 1k-token prompt of a 100M model on the H200),
        and groups of a run arrive one by one as earlier ones finish: waiting a few decode rounds lets several
        share one forward. It waits at most `prefill_wait_steps` decode steps, and none once a quarter of the
        slots wait (they would decode nothing meanwhile)."""
        return self._waited >= self.prefill_wait_steps or 4 * len(waiting) >= self.rows

    def _release_slots(self, batch: list[_Request]) -> list[_Request]:
        """Give back the slots of requests that are done, failed or gone (cancelled); returns those still live."""
        live = [r for r in batch if not r.done.done() and r.finish is None and r.error is None]
        live_ids = {id(r) for r in live}
        for slot, owner in list(self._owner.items()):
            if id(owner) not in live_ids:
                del self._owner[slot]
                owner.slot = None
                heapq.heappush(self._free, slot)
        return live

    def _guarded(self, fn: Callable[..., None], reqs: list[_Request], version: int, *args: Any) -> bool:
        """A failed forward (e.g. out of memory on long prompts) fails the requests it carried, not the engine.
        Returns whether `fn` succeeded."""
        try:
            fn(reqs, version, *args)
            return True
        except Exception as exc:
            log.exception("%s of %d request(s) failed", fn.__name__.strip("_"), len(reqs))
            for r in reqs:
                if r.finish is None:
                    r.error = exc
            return False

    def _on_device(self, values: Any, dtype: torch.dtype) -> torch.Tensor:
        """A host list or array as a device tensor without waiting for the device: from pinned memory, copied
        asynchronously. (A plain copy from pageable memory synchronises the stream, so a prefill would wait for
        the decode steps launched before it.)"""
        import torch

        t = torch.as_tensor(np.asarray(values), dtype=dtype)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def _record(self, reqs: list[_Request], out: Any, version: int) -> None:
        """Tokens and raw log-probs ([2, n] on the host, row i for reqs[i]) appended, finish reasons set."""
        toks, lps = out[0].tolist(), out[1].tolist()
        for r, t, lp in zip(reqs, toks, lps, strict=True):
            r.tokens.append(int(t))
            r.logprobs.append(lp)
            r.versions.append(version)
            r.finish = self._finish_reason(r)
        self._counters.tokens_generated += len(reqs)

    @staticmethod
    def _truncates(reqs: list[_Request]) -> bool:
        return any(r.spec.temperature > 0 and ((r.spec.top_k or 0) > 0 or r.spec.top_p < 1.0) for r in reqs)

    # -- prefill ------------------------------------------------------------------------------------------------
    def _prefill(self, reqs: list[_Request], version: int) -> None:
        # Identical sequences (a group's G samples of one prompt) are computed once; the others copy its KV.
        same: dict[tuple[int, ...], list[_Request]] = {}
        for r in reqs:
            same.setdefault(tuple(r.prompt + r.tokens), []).append(r)
        unique = sorted(same.values(), key=lambda g: len(g[0].prompt) + len(g[0].tokens), reverse=True)
        chunk: list[list[_Request]] = []
        for group in unique:  # longest first: less padding per chunk, and the chunk's width is its first's
            width = len(chunk[0][0].prompt) + len(chunk[0][0].tokens) if chunk else 0
            if chunk and width * (len(chunk) + 1) > self.max_prefill_tokens:
                self._prefill_chunk(chunk, version)
                chunk = []
            chunk.append(group)
        if chunk:
            self._prefill_chunk(chunk, version)

    def _prefill_chunk(self, groups: list[list[_Request]], version: int) -> None:
        import torch

        assert self._cache is not None
        seqs = [g[0].prompt + g[0].tokens for g in groups]
        n, width = len(seqs), max(len(s) for s in seqs)
        ids = np.zeros((n, width), dtype=np.int64)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = s
        dev = self.device
        lens = self._on_device([len(s) for s in seqs], torch.long)
        self._cache.prefill(self._on_device([g[0].slot for g in groups], torch.long))
        hidden = self._base(
            input_ids=self._on_device(ids, torch.long), position_ids=torch.arange(width, device=dev).expand(n, width),
            attention_mask={"full_attention": None}, past_key_values=self._cache, use_cache=True,
        ).last_hidden_state
        logits = self._head(hidden[torch.arange(n, device=dev), lens - 1])
        src = [g[0].slot for g in groups for _ in g[1:]]
        if src:
            dst = [r.slot for g in groups for r in g[1:]]
            self._cache.copy_rows(self._on_device(src, torch.long), self._on_device(dst, torch.long), width)
        reqs = [r for g in groups for r in g]
        logits = logits[self._on_device([i for i, g in enumerate(groups) for _ in g], torch.long)]
        n_req = len(reqs)
        slots = np.array([r.slot for r in reqs])
        host = self._prefill_host[:, :n_req].numpy()
        host[:3] = self._slot_params[:, slots]
        host[3] = seeded_uniforms(self._slot_seed[slots], np.array([len(r.tokens) for r in reqs]))
        params = self._prefill_host[:, :n_req].to(dev, non_blocking=True)
        tokens, lps = sample_rows(logits, params[0], params[1].long(), params[2], params[3],
                                  truncate=self._truncates(reqs))
        out = torch.stack([tokens.float(), lps]).cpu().numpy()
        self.forwards["prefill"] += 1
        for r in reqs:
            r.cache = True
        self._record(reqs, out, version)

    # -- decode -------------------------------------------------------------------------------------------------
    def _launch_decode(self, reqs: list[_Request], version: int, steps: int) -> None:
        """Up to `steps` decode steps for `reqs`, launched back to back (on CUDA nothing waits for them here);
        `_finish_decode` reads their tokens."""
        d = self._steps
        assert d is not None
        t0 = time.perf_counter()
        # Past the longest budget left, a step would only make tokens that are dropped.
        k = min(steps, self.decode_steps, max(r.max_tokens - len(r.tokens) for r in reqs))
        b = _bucket(max(r.slot for r in reqs if r.slot is not None) + 1, self.rows, 1)
        # Each row attends up to its own position; the window covers the longest over the round's steps.
        longest = max(len(r.prompt) + len(r.tokens) for r in reqs) + k - 1
        grain = d.attend_grain()
        attend = min(self.max_model_len, -(-longest // grain) * grain)
        h = d.host_inputs
        slots = np.array([r.slot for r in reqs])
        counts = np.array([len(r.tokens) for r in reqs])
        fill_idle_rows(h, b, self.max_model_len)
        h[IDS, slots] = [r.tokens[-1] for r in reqs]
        h[POS, slots] = np.array([len(r.prompt) for r in reqs]) + counts - 1
        h[TEMP : TOPP + 1, slots] = self._slot_params[:, slots]
        seeds = self._slot_seed[slots]
        for j in range(k):  # token i of a request always draws uniform (seed, i), whichever step samples it
            h[UNIF + j, slots] = seeded_uniforms(seeds, counts + j)
        t1 = time.perf_counter()
        d.launch(b, attend, self._truncates(reqs), k)
        self._launched = k
        self.forwards["graph_captures"] = d.captures
        self.timings["decode_prep_s"] += t1 - t0
        self.timings["decode_forward_s"] += time.perf_counter() - t1

    def _finish_decode(self, reqs: list[_Request], version: int) -> None:
        """Wait for the launched steps and record each request's tokens up to its stop."""
        assert self._steps is not None
        t1 = time.perf_counter()
        self._steps.wait()
        k, self._launched = self._launched, 0
        self.forwards["decode"] += k
        self.forwards["decode_rounds"] += 1
        t2 = time.perf_counter()
        active = reqs
        for j in range(k):
            active = [r for r in active if r.finish is None]
            if not active:
                break
            self._record(active, self._steps.host_out[j][:, [r.slot for r in active]], version)
        t = self.timings
        t["decode_forward_s"] += t2 - t1
        t["decode_record_s"] += time.perf_counter() - t2
