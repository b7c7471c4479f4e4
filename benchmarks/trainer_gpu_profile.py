"""Where a trainer step's GPU time goes, and microbenchmarks of the kernels that bound it (trainer_gpu_bench.py).

* `profile_step`: one step under torch.profiler; every CUDA kernel in a category (attention forward / backward,
  GEMMs, the lm_head's chunks, norms + rotary + elementwise, optimizer + gradient norm, copies), the lm_head's
  kernels found by the `trainer.logprobs.HEAD_RANGE` range they run in, the optimizer's by its range; busy time (the
  union of kernel intervals) against the span from the first kernel to the last, so `idle_ms` is the GPU waiting on
  the host (launch overhead, host syncs).
* `attention_bench`: causal bf16 attention of the shape's heads per SDPA backend and FlexAttention, fwd and fwd+bwd.
* `head_bench`: the compiled lm_head softmax passes over one [chunk, vocab] block, vocabulary static vs symbolic,
  against the bytes they must move.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any

import torch

CATEGORIES = ("attention fwd", "attention bwd", "gemm", "lm_head gemm", "lm_head softmax", "norm/rotary/elementwise",
              "optimizer + grad norm", "memcpy/memset")
_ATTN_BWD = re.compile(r"bprop|flash_bwd|dot_do_o|convert_dq|attention_backward|fmha.*bwd|flex_attention_backward")
_ATTN_FWD = re.compile(r"fprop|flash_fwd|fmha|flex_attention|attention_fwd")
_GEMM = re.compile(r"nvjet|gemm|cutlass|xmma|triton_tem_fused_(add)?mm|sm90_.*_tn|splitk", re.I)


def category(kernel: str, in_head: bool, in_optimizer: bool) -> str:
    """The category of one kernel by its name and the profiler range it ran in."""
    n = kernel.lower()
    if "memcpy" in n or "memset" in n:
        return "memcpy/memset"
    if in_optimizer or "multi_tensor_apply" in n or "fused_adam" in n:
        return "optimizer + grad norm"
    gemm = bool(_GEMM.search(n))
    if in_head:
        return "lm_head gemm" if gemm else "lm_head softmax"
    if _ATTN_BWD.search(n):
        return "attention bwd"
    if _ATTN_FWD.search(n):
        return "attention fwd"
    return "gemm" if gemm else "norm/rotary/elementwise"


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    busy, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:
            busy += e - max(s, end)
            end = e
    return busy / 1e3


def summarize(events: Any, head_range: str, rows: int = 25) -> dict[str, Any]:
    """Category table, busy / idle and the top kernels of a profiler's `events()` (times in us)."""
    gpu = [e for e in events if e.device_type.name == "CUDA"]
    ranges = {name: [(e.time_range.start, e.time_range.end) for e in gpu if e.is_user_annotation and name in e.name]
              for name in (head_range, "Optimizer.step")}
    kernels = [e for e in gpu if not e.is_user_annotation]

    def inside(e: Any, name: str) -> bool:
        mid = (e.time_range.start + e.time_range.end) / 2
        return any(s <= mid <= t for s, t in ranges[name])

    cats = dict.fromkeys(CATEGORIES, 0.0)
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        ms = (e.time_range.end - e.time_range.start) / 1e3
        cats[category(e.name, inside(e, head_range), inside(e, "Optimizer.step"))] += ms
        by_name.setdefault(e.name, []).append(ms)
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    busy = _union_ms(spans)
    span = (max(e for _, e in spans) - min(s for s, _ in spans)) / 1e3 if spans else 0.0
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:rows]
    return {"categories_ms": cats, "kernel_ms": sum(cats.values()), "busy_ms": busy, "span_ms": span,
            "idle_ms": span - busy,
            "top": [{"kernel": k[:160], "ms": sum(v), "calls": len(v)} for k, v in top]}


def profile_step(fn: Any) -> dict[str, Any]:
    """Profile one call of `fn` (after which the device is synchronised) and summarise it (module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    from trainer.logprobs import HEAD_RANGE

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    out = summarize(prof.events(), HEAD_RANGE)
    print(" | ".join(f"{k} {v:.1f}" for k, v in out["categories_ms"].items()),
          f"| busy {out['busy_ms']:.1f} of {out['span_ms']:.1f} ms", flush=True)
    return out


def _time_attention(fwd: Any, args: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    from triton.testing import do_bench

    def fwd_bwd() -> None:
        out = fwd(*args)
        torch.autograd.grad(out, args, torch.ones_like(out))

    return {"fwd_ms": do_bench(lambda: fwd(*args), warmup=25, rep=100, return_mode="median"),
            "fwd_bwd_ms": do_bench(fwd_bwd, warmup=25, rep=100, return_mode="median")}


def _sdpa(backend: Any, gqa: bool) -> Any:
    from torch.nn.attention import sdpa_kernel

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
        with ctx:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    return fwd


def _flex(seq_len: int, device: torch.device) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def causal(b: Any, h: Any, q: Any, kv: Any) -> Any:
        return q >= kv

    mask = create_block_mask(causal, None, None, seq_len, seq_len, device=device)
    compiled = torch.compile(flex_attention)

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return compiled(q, k, v, block_mask=mask, enable_gqa=True)

    return fwd


def _fa4() -> Any:
    """FlashAttention-4's CuTe kernels (package flash-attn-4; its sm90 path is FA3's Hopper design), on [B, S, H, D]
    inputs. Absent from the lent machine's image: the bench finds it only where it was carried in."""
    from flash_attn.cute import flash_attn_func

    def fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = flash_attn_func(q, k, v, causal=True)[0]
        return out

    return fwd


def attention_bench(shape: dict[str, int], configs: list[tuple[int, int]], device: torch.device,
                    flex: bool = True) -> list[dict[str, Any]]:
    """Causal bf16 attention of the shape's heads at each (length, batch), fwd and fwd+bwd: SDPA's default pick,
    each SDPA backend with GQA (`enable_gqa`, as transformers calls it) and with K/V repeated, and FlexAttention
    (Triton). TFLOP/s count the causal half: forward 2 B S^2 H D, forward + backward 3x that (the MFU convention,
    not the kernel's recomputation)."""
    from torch.nn.attention import SDPBackend

    heads, kv = shape["num_attention_heads"], shape["num_key_value_heads"]
    dim = shape["hidden_size"] // heads
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    rows: list[dict[str, Any]] = []
    for s, b in configs:
        q, k, v = (torch.randn(b, h, s, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
                   for h in (heads, kv, kv))
        kr, vr = (x.detach().repeat_interleave(heads // kv, dim=1).requires_grad_() for x in (k, v))
        fwd_flops = 2.0 * b * s * s * heads * dim  # causal half of 4 B S^2 H D
        variants = [(name, gqa, _sdpa(be, gqa)) for name, be in backends.items() for gqa in (True, False)]
        if flex:
            variants.append(("flex", True, _flex(s, device)))
        variants.append(("fa4", True, None))
        bshd = tuple(x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
        for name, gqa, fn in variants:
            row: dict[str, Any] = {"seq_len": s, "batch": b, "backend": name, "gqa": gqa, "head_dim": dim}
            try:
                if name == "fa4":
                    row.update(_time_attention(_fa4(), bshd))
                else:
                    row.update(_time_attention(fn, (q, k, v) if gqa else (q, kr, vr)))
                row.update(fwd_tflops=fwd_flops / row["fwd_ms"] / 1e9,
                           fwd_bwd_tflops=3 * fwd_flops / row["fwd_bwd_ms"] / 1e9,
                           bwd_tflops=2 * fwd_flops / (row["fwd_bwd_ms"] - row["fwd_ms"]) / 1e9)
            except Exception as e:  # noqa: BLE001 - a backend this GPU or shape lacks is a row, not a crash
                row["error"] = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
            print(row, flush=True)
            rows.append(row)
        torch.cuda.empty_cache()
    return rows


def head_bench(vocab: int, rows: int, device: torch.device) -> list[dict[str, Any]]:
    """The fused lm_head softmax passes of trainer.logprobs over one [rows, vocab] bf16 block, compiled with the
    vocabulary symbolic (as before issue 22) and static (`_static_vocab`), with the GB/s of the bytes each must move
    (forward-with-saved-gradient: read the block twice, write it once; recompute backward: read once, write once)."""
    from triton.testing import do_bench

    from trainer.logprobs import _bwd_chunk, _fwd_chunk_save

    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(rows, vocab, device=device, generator=g).to(torch.bfloat16)
    targets = torch.randint(0, vocab, (rows,), device=device, generator=g)
    grad = torch.randn(rows, device=device, generator=g)
    lse = torch.logsumexp(logits.float(), -1)
    block = logits.numel() * logits.element_size()
    out: list[dict[str, Any]] = []
    for static in (False, True):
        torch._dynamo.reset()  # compiled code is cached per function: the two variants must not share an entry
        fwd = torch.compile(_fwd_chunk_save, dynamic=True)
        bwd = torch.compile(_bwd_chunk, dynamic=True)
        work = logits.clone()

        def run_fwd(x: torch.Tensor = work, f: Any = fwd, st: bool = static) -> Any:
            if st:
                torch._dynamo.mark_static(x, 1)
            return f(x, targets, 1.0)

        def run_bwd(x: torch.Tensor = logits, f: Any = bwd, st: bool = static) -> Any:
            if st:
                torch._dynamo.mark_static(x, 1)
            return f(x, targets, lse, grad, 1.0)

        fwd_ms = do_bench(run_fwd, warmup=10, rep=50, return_mode="median")
        bwd_ms = do_bench(run_bwd, warmup=10, rep=50, return_mode="median")
        row = {"static_vocab": static, "rows": rows, "fwd_save_ms": fwd_ms, "fwd_save_gbps": 3 * block / fwd_ms / 1e6,
               "bwd_ms": bwd_ms, "bwd_gbps": 2 * block / bwd_ms / 1e6}
        print(row, flush=True)
        out.append(row)
    torch._dynamo.reset()  # the trainer's compiled head kernels start clean (static vocabulary)
    return out
