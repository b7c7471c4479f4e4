"""Pieces of benchmarks/trainer_gpu_bench.py: model shapes, FLOP counts (both MFU conventions), agent-mode
observation spans, the peak-memory split, a kernel profile, a microbenchmark of the attention kernels torch offers
on this GPU, and the on-device check of the fused log-prob's saved vs recomputed logit gradients."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

PEAK_FLOPS = 989e12  # dense bf16, H100/H200 SXM
SHAPES: dict[str, dict[str, int]] = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936),
}
GIB = 2**30


def flops_per_token(model: Any, seq_len: int, *, causal: bool, head_fraction: float = 1.0) -> float:
    """6 N (N = all parameters, the tied embedding once: it is the lm_head matmul) + attention 12 L H S, halved when
    `causal`: a causal kernel computes only the lower triangle of QK^T and PV, so the full count credits FLOPs no
    kernel does. The causal-aware figure is the headline; the full count is the convention of issue 6. The lm_head's
    6 V H counts only on the `head_fraction` of tokens that go through it (the trainer skips masked-out ones)."""
    n = sum(p.numel() for p in model.parameters())
    c = model.config
    head = c.vocab_size * c.hidden_size
    attn = 12.0 * c.num_hidden_layers * c.hidden_size * seq_len
    return 6.0 * (n - head) + 6.0 * head * head_fraction + (attn / 2 if causal else attn)


def observation_spans(n: int, *, seed: int = 0, generated: tuple[int, int] = (64, 768),
                      observed: tuple[int, int] = (128, 2048)) -> list[tuple[int, int]]:
    """An agent trajectory of `n` response tokens as (start, length) observation spans (tool output, in the context
    but not in the loss) between generated spans (trained), span lengths uniform in the given ranges, starting with a
    generated span (about 28% of the tokens generated)."""
    g = torch.Generator().manual_seed(seed)
    spans, t, gen = [], 0, True
    while t < n:
        lo, hi = generated if gen else observed
        span = min(n - t, int(torch.randint(lo, hi + 1, (1,), generator=g)))
        if not gen:
            spans.append((t, span))
        t, gen = t + span, not gen
    return spans


class ActivationProbe:
    """Memory the decoder stack's forward leaves allocated (saved activations, autocast's bf16 weight copies, the
    output hidden states): allocated at its end minus at its start. Hooks stay until `close()`."""

    def __init__(self, decoder: torch.nn.Module) -> None:
        self.before = self.after = 0
        self._handles = [decoder.register_forward_pre_hook(self._pre), decoder.register_forward_hook(self._post)]

    def _pre(self, *_: Any) -> None:
        self.before = torch.cuda.memory_allocated()

    def _post(self, *_: Any) -> None:
        self.after = torch.cuda.memory_allocated()

    def close(self) -> float:
        for h in self._handles:
            h.remove()
        return (self.after - self.before) / GIB


def logits_sweep(hidden: int, vocab: int, lengths: list[int], budgets_gb: list[float], *, chunk: int,
                 device: torch.device) -> list[dict[str, Any]]:
    """`logits_memory_gb` at each token count and saved-gradient budget: flat in length once the budget is full."""
    rows = [{"tokens": n, "saved_grad_gb": b,
             "logits_gb": logits_memory_gb(hidden, vocab, n, chunk=chunk, saved_bytes=int(b * GIB), device=device)}
            for b in budgets_gb for n in lengths]
    for r in rows:
        print(r, flush=True)
    return rows


def logits_memory_gb(hidden: int, vocab: int, tokens: int, *, chunk: int, saved_bytes: int,
                     device: torch.device) -> float:
    """Peak memory of the fused lm_head + log-softmax alone, forward + backward, over its inputs (as in the step:
    fp32 hidden states and weight under bf16 autocast). Includes its fp32 weight-gradient accumulator and the
    hidden-state gradient; what grows with `tokens` beyond those is the kept logit gradients, up to `saved_bytes`."""
    from trainer.logprobs import linear_logprobs

    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(tokens, hidden, device=device, generator=g).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device, generator=g) * 0.02).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = linear_logprobs(h, w, t, chunk=chunk, compiled=True, save_bytes=saved_bytes)
    out.sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del h, w, t, out
    return peak / GIB


def profile_kernels(fn: Any, rows: int = 25, show: bool = True) -> list[dict[str, Any]]:
    """The CUDA kernels of one call of `fn`, most device time first (also printed as a table)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    events.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in events)
    if show:
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70))
    return [{"kernel": e.key[:160], "ms": e.device_time_total / 1e3, "share": e.device_time_total / total,
             "calls": e.count} for e in events[:rows]]


def _time_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, gqa: bool, backend: Any,
                    kernels: bool) -> dict[str, Any]:
    from torch.nn.attention import sdpa_kernel
    from triton.testing import do_bench

    def fwd() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    def fwd_bwd() -> None:
        out = fwd()
        torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
    try:
        with ctx:
            row: dict[str, Any] = {"fwd_ms": do_bench(fwd, warmup=25, rep=100, return_mode="median"),
                                   "fwd_bwd_ms": do_bench(fwd_bwd, warmup=25, rep=100, return_mode="median")}
            if kernels:
                row["kernels"] = [k["kernel"] for k in profile_kernels(fwd_bwd, rows=4, show=False)]
    except RuntimeError as e:
        return {"error": str(e).splitlines()[0][:200]}
    return row


def attention_bench(shape: dict[str, int], seq_lens: list[int], device: torch.device) -> list[dict[str, Any]]:
    """Causal bf16 attention of the shape's heads at each length, fwd and fwd+bwd, per SDPA backend, with GQA
    (`enable_gqa`, as transformers calls it) and with K/V repeated to all heads. TFLOP/s count the causal half:
    forward 2 S^2 H D, forward + backward 3x that (the MFU convention, not the kernel's recomputation)."""
    from torch.nn.attention import SDPBackend

    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    dim = shape["hidden_size"] // heads
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rows: list[dict[str, Any]] = []
    for s in seq_lens:
        q, k, v = (torch.randn(1, h, s, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
                   for h in (heads, kv, kv))
        kr, vr = (x.detach().repeat_interleave(heads // kv, dim=1).requires_grad_() for x in (k, v))
        fwd_flops = 2.0 * s * s * heads * dim  # causal half of 4 S^2 H D
        for name, backend in backends.items():
            for gqa in (True, False):
                row: dict[str, Any] = {"seq_len": s, "backend": name, "gqa": gqa, "head_dim": dim}
                row.update(_time_attention(q, k if gqa else kr, v if gqa else vr, gqa=gqa, backend=backend,
                                           kernels=name == "default"))
                if "fwd_ms" in row:
                    row.update(fwd_tflops=fwd_flops / row["fwd_ms"] / 1e9,
                               fwd_bwd_tflops=3 * fwd_flops / row["fwd_bwd_ms"] / 1e9)
                print(row, flush=True)
                rows.append(row)
        torch.cuda.empty_cache()
    return rows


def check_logprob_grads(device: torch.device) -> dict[str, float]:
    """The compiled lm_head + log-softmax on this device, logit gradients saved vs recomputed (bf16 autocast over
    fp32 inputs, as in the step): the largest difference relative to the largest entry, per output."""
    from trainer.logprobs import linear_logprobs

    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(5000, 896, device=device, generator=g)
    w = torch.randn(32000, 896, device=device, generator=g) * 0.05
    t = torch.randint(0, 32000, (5000,), device=device, generator=g)
    go = torch.randn(5000, device=device, generator=g)
    res = []
    for save in (0, 1 << 30):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = linear_logprobs(hh, ww, t, chunk=1024, compiled=True, save_bytes=save)
        res.append((out.detach(), *torch.autograd.grad(out, (hh, ww), go)))
    names = ("logprob", "grad_hidden", "grad_weight")
    return {n: float((a - b).abs().max() / b.abs().max()) for n, a, b in zip(names, res[1], res[0], strict=True)}
