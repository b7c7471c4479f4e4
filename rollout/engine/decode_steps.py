"""`DecodeSteps`: the batched HF engine's decode step, as the device runs it.

One step advances rows `0..b-1` of a `SlotKVCache` by one token each: the model's forward over one token per row,
attending over the first `attend_len` positions, then per-row sampling (`batch_sampling.sample_rows`). Its inputs
live in one fixed device buffer (token id, position, sampling parameters, and one uniform per step of the round) and
a step writes the next step's inputs into it (the sampled tokens, positions one on, the next uniform first). So a
round of k steps is: the host fills the buffer once, the steps are launched back to back, and one copy brings every
step's tokens and raw log-probs back. On CUDA the step is a captured graph per (b, attend_len, truncate); static
shapes and addresses keep the graphs valid across weight pushes, which copy into the same parameter tensors.

The scheduling (which requests, which rows, when a round ends) is the engine's (`hf_batched.py`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rollout.engine.batch_sampling import sample_rows
from rollout.engine.slot_cache import SlotKVCache

# Rows of the input buffer: token id, position, temperature, top_k, top_p, then one uniform per step of the round
# (all exact in float32: ids and positions are below 2**24). A step samples with row UNIF and shifts the later
# uniforms up for the next.
IDS, POS, TEMP, TOPK, TOPP, UNIF = range(6)


class DecodeSteps:
    def __init__(self, *, base: Any, head: Any, cache: SlotKVCache, rows: int, max_len: int, steps: int,
                 device: torch.device, graphs: bool) -> None:
        self._base, self._head, self._cache = base, head, cache
        self.max_len, self.steps, self.device = max_len, steps, device
        self.inputs = torch.zeros(UNIF + steps, rows, dtype=torch.float32, device=device)
        self._out = torch.zeros(steps, 2, rows, dtype=torch.float32, device=device)
        pin = device.type == "cuda"
        self._host_inputs = torch.zeros(UNIF + steps, rows, dtype=torch.float32, pin_memory=pin)
        self._host_out = torch.zeros(steps, 2, rows, dtype=torch.float32, pin_memory=pin)
        # numpy views of the same memory: per-row writes from Python cost ~0.1 us there, ~5 us as tensor indexing
        self.host_inputs = self._host_inputs.numpy()
        """[UNIF + steps, rows]: what the host writes before `launch`."""
        self.host_out = self._host_out.numpy()
        """[steps, 2, rows]: each step's (token, raw log-prob) per row, valid after `wait`."""
        self.graphs_on = graphs and device.type == "cuda"
        self._graphs: dict[tuple[int, int, bool], tuple[Any, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if self.graphs_on else None
        self.captures = 0

    def attend_grain(self) -> int:
        """Attended lengths are rounded up to a multiple of this: graphs are captured per multiple of 256 (eager:
        of 32), few shapes and little attention over padding."""
        return 256 if self.graphs_on else 32

    def launch(self, b: int, attend: int, truncate: bool, k: int) -> None:
        """`k` steps over rows 0..b-1 from `host_inputs`, launched back to back; on CUDA nothing waits for them."""
        self.inputs[: UNIF + k, :b].copy_(self._host_inputs[: UNIF + k, :b], non_blocking=True)
        for j in range(k):
            out = self.replay(b, attend, truncate) if self.graphs_on else self.forward(b, attend, truncate)
            self._out[j, :, :b].copy_(out)
        self._host_out[:k, :, :b].copy_(self._out[:k, :, :b], non_blocking=True)

    def wait(self) -> None:
        """Until the launched steps' tokens are in `host_out`."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def forward(self, b: int, attend: int, truncate: bool) -> torch.Tensor:
        """One step over rows 0..b-1 from `inputs`: [2, b] (token as float, raw log-prob); then `inputs` holds the
        next step's. Static shapes: this is what a CUDA graph captures."""
        x = self.inputs
        self._cache.positions[:b].copy_(x[POS, :b].long())
        mask = self._cache.decode(b, attend)
        hidden = self._base(
            input_ids=x[IDS, :b].long()[:, None], position_ids=self._cache.positions[:b, None],
            attention_mask={"full_attention": mask}, past_key_values=self._cache, use_cache=True,
        ).last_hidden_state
        logits = self._head(hidden[:, -1])
        tokens, lps = sample_rows(logits, x[TEMP, :b], x[TOPK, :b].long(), x[TOPP, :b], x[UNIF, :b],
                                  truncate=truncate)
        out = torch.stack([tokens.float(), lps])
        x[IDS, :b] = out[0]
        x[POS, :b] = (x[POS, :b] + 1).clamp_(max=self.max_len - 1)
        if x.shape[0] > UNIF + 1:
            x[UNIF:-1, :b] = x[UNIF + 1 :, :b].clone()
        return out

    def replay(self, b: int, attend: int, truncate: bool) -> torch.Tensor:
        """`forward` as a CUDA graph, captured on first use of its shape."""
        key = (b, attend, truncate)
        if key not in self._graphs:
            # Warm-up runs on a side stream (kernel autotuning, lazy allocations) before the capture; they write
            # keys/values at the rows' next positions, which a row's own step writes again before it reads them.
            # A step moves its inputs on, so they are put back for the real one.
            inputs = self.inputs.clone()
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.forward(b, attend, truncate)
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                out = self.forward(b, attend, truncate)
            self._graphs[key] = (graph, out)
            self.captures += 1
            self.inputs.copy_(inputs)
        graph, out = self._graphs[key]
        graph.replay()
        return out


def fill_idle_rows(h: np.ndarray, b: int, max_len: int) -> None:
    """Rows 0..b-1 as idle: they write their (discarded) key/value at the last position, which no request ever
    feeds (a request stops with at most max_len tokens, so the last position fed is max_len - 2); a step moves a
    row's position on but never past it. Greedy, untruncated."""
    h[IDS, :b] = 0
    h[POS, :b] = max_len - 1
    h[TEMP, :b] = 0
    h[TOPK, :b] = 0
    h[TOPP, :b] = 1
