"""Trainer throughput and memory on one GPU, 4K to agent-length sequences: our training step vs a naive transformers
loop, in the same process.

    python benchmarks/trainer_gpu_bench.py --shape 0.5b --configs 4096x4,32768x1,65536x1 --ac-modes none,layer
    torchrun --nproc-per-node=2 benchmarks/trainer_gpu_bench.py --batch-sizes 4        # issue 6's FSDP2 rows

Models (random weights, tied embeddings): `--shape 0.5b` is Qwen2-0.5B's shape (hidden 896, 24 layers, 14 heads,
2 KV heads, MLP 4864, vocab 151936), `1.5b` Qwen2-1.5B's (hidden 1536, 28 layers, 12 heads, 2 KV heads, MLP 8960).
`--configs LENxBATCH,...` lists the measurements (sequence length x samples per micro-batch); without it, every
`--batch-sizes` at `--seq-len`. Each length runs under every `--ac-modes` (none | layer | mlp:
policy.activation_checkpointing[_scope]); a mode that runs out of memory at one length is not tried longer.

* naive: bf16 parameters, sdpa, `model(ids, labels=ids).loss.backward()`, fused AdamW; no compile, no FSDP. Each
  rank runs it alone (no gradient sync): it is the per-GPU baseline. It runs at the same lengths until it runs out
  of memory.
* trainer: the real code path of trainer.step.StepRunner. One GPU: fp32 masters under bf16 autocast; several:
  FSDP2 over all ranks with a bf16 MixedPrecisionPolicy. Per-layer torch.compile, the fused chunked lm_head +
  log-softmax (logit gradients saved in the forward up to --saved-grad-gb), packing, the GRPO loss with IS
  correction (tis, cap 2), clipping (one GPU: inside the fused AdamW, no host sync), fused AdamW. Each sample is a
  1-token prompt + (len - 1) response tokens, so both loops put every position through the lm_head; the loss mask
  is an agent trajectory's (`--mask agent`: Trajectory.observation_spans, so trainer.batch builds it: generated
  spans of 64-768 tokens trained, observations of 128-2048 masked out). Old log-probs are recomputed once,
  outside the timed region (`recompute_s`).

MFU = model FLOPs / time / 989 TFLOP/s (dense bf16, H100/H200 SXM), two ways (trainer_gpu_parts.flops_per_token):
`mfu_causal` (the headline: attention FLOPs halved, what a causal kernel computes) and `mfu` (issue 6's convention,
attention counted in full). The lm_head counts only on the tokens that go through it (`head_token_fraction`: the
trainer skips masked-out ones, the naive loop does all); activation checkpointing's recomputation is not counted.
Peak memory is split into parameters + gradients + optimizer state (allocated after a step), activations (what the
decoder's forward leaves allocated, autocast's bf16 weight copies included) and logits (the fused lm_head's own
peak, measured alone at the same token count); `other_gb` is the rest of the peak.

`--profile` times one step by kernel category (trainer_gpu_profile.profile_step), `--attn-bench` / `--head-bench` the
attention and lm_head-softmax kernels alone; `--attn flash_attention_4` needs the flash-attn-4 package (carried in as
wheels); `--cpu-smoke` runs every code path on a CPU (tiny `--layers`, `--no-compile`) before a device call.

Compiled layers run with dynamic shapes from the first step (as the trainer's do from its second step on), so each
mode compiles once. JSON goes to --out, else $OUT/trainer_gpu_bench.json, else ./trainer_gpu_bench.json (rank 0),
rewritten after every measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402
from trainer_gpu_parts import (  # noqa: E402
    GIB,
    PEAK_FLOPS,
    SHAPES,
    ActivationProbe,
    check_logprob_grads,
    flops_per_token,
    grpo_batch,
    logits_memory_gb,
    logits_sweep,
    trainer_config,
)
from trainer_gpu_profile import attention_bench, head_bench, profile_step  # noqa: E402

from trainer.dist import Dist, pick_device, read_env  # noqa: E402
from trainer.logprobs import trained_only  # noqa: E402
from trainer.model import wrap_policy  # noqa: E402
from trainer.step import StepRunner, make_optimizer  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    p.add_argument("--configs", default="", help="LENxBATCH,... (default: --batch-sizes at --seq-len)")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch-sizes", default="1,4", help="samples per GPU per step, comma-separated")
    p.add_argument("--ac-modes", default="none", help="comma-separated: none | layer | mlp")
    p.add_argument("--mask", choices=("agent", "all"), default="agent", help="loss mask over the response")
    p.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile happens here)")
    p.add_argument("--layers", type=int, default=0, help="fewer layers for a smoke test (0: the shape's)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--keep-gathered", action="store_true",
                   help="policy.fsdp_reshard_after_forward=false (several GPUs: no re-gather in the backward)")
    p.add_argument("--chunk", type=int, default=4096, help="policy.logprob_chunk_tokens")
    p.add_argument("--saved-grad-gb", type=float, default=8.0,
                   help="policy.logprob_saved_grad_gb (0: the backward recomputes the lm_head logits)")
    p.add_argument("--sync-clip", action="store_true",
                   help="ablation: clip with clip_grad_norm_ and a host sync before the optimizer step (the path "
                        "several ranks take) instead of inside the fused AdamW")
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--attn", choices=("sdpa", "flash_attention_4"), default="sdpa",
                   help="policy.attn_implementation of the trainer (the naive loop keeps sdpa); flash_attention_4 "
                   "runs outside the compiled layers (trainer.model.flash_attention_4_outside_compile)")
    p.add_argument("--fp32-residual", action="store_true",
                   help="ablation: policy.low_precision_residual=false (fp32 residual stream on one GPU)")
    p.add_argument("--profile", default="", help="LENxBATCH:MODE,... trainer measurements to profile ('all': every "
                   "one): a kernel-category table (trainer_gpu_profile.profile_step)")
    p.add_argument("--attn-bench", default="", help="LEN[xBATCH],... of the attention-kernel microbenchmark")
    p.add_argument("--no-flex", action="store_true", help="attention microbenchmark without FlexAttention")
    p.add_argument("--head-bench", type=int, default=0, help="rows of one lm_head softmax block to time (0: none)")
    p.add_argument("--dynamic-vocab", action="store_true",
                   help="ablation: the lm_head softmax kernels compiled with a symbolic vocabulary (before issue 22)")
    p.add_argument("--cpu-smoke", action="store_true", help="run on CPU (tiny --layers, --no-compile): code paths only")
    p.add_argument("--logits-sweep", default="", help="token counts: the fused lm_head's memory alone, kept "
                   "logit gradients 0 and --saved-grad-gb")
    p.add_argument("--budget-s", type=float, default=0.0, help="start no measurement after this many seconds")
    p.add_argument("--out", default=None)
    return p.parse_args()


def configs(args: argparse.Namespace) -> list[tuple[int, int]]:
    if args.configs:
        pairs = [c.lower().split("x") for c in args.configs.split(",")]
        return sorted((int(s), int(b)) for s, b in pairs)
    return [(args.seq_len, int(b)) for b in args.batch_sizes.split(",")]


def qwen2(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, attn: str = "sdpa") -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = SHAPES[args.shape]
    kw: dict[str, Any] = {**shape, "num_hidden_layers": args.layers or shape["num_hidden_layers"],
                          "tie_word_embeddings": True, "max_position_embeddings": 262144, "use_cache": False,
                          "attn_implementation": attn}
    torch.manual_seed(0)
    with torch.device(device):
        model: Any = Qwen2ForCausalLM(Qwen2Config(**kw))
    return model.to(dtype)


def _sync_time(fn: Callable[[], Any], steps: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def _figures(tokens: int, dt: float, model: Any, seq_len: int, head_fraction: float = 1.0) -> dict[str, Any]:
    tps = tokens / dt
    return {"step_s": dt, "tokens_per_s": tps, "head_token_fraction": head_fraction,
            "mfu_causal": tps * flops_per_token(model, seq_len, causal=True, head_fraction=head_fraction) / PEAK_FLOPS,
            "mfu": tps * flops_per_token(model, seq_len, causal=False, head_fraction=head_fraction) / PEAK_FLOPS,
            "peak_gb": torch.cuda.max_memory_allocated() / GIB}


def bench_naive(args: argparse.Namespace, seq_len: int, batch: int, device: torch.device) -> dict[str, Any]:
    model = qwen2(args, device, torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, SHAPES[args.shape]["vocab_size"], (batch, seq_len), device=device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        step()
    dt = _sync_time(step, args.steps)
    return _figures(batch * seq_len, dt, model, seq_len)


class TrainerBench:
    """One policy + optimizer for one activation-checkpointing mode, measured at several lengths."""

    def __init__(self, args: argparse.Namespace, ac: str, dist: Dist) -> None:
        self.args, self.ac, self.dist = args, ac, dist
        cfg = trainer_config(args, 4096, 1, ac, dist.world_size)
        self.lm = qwen2(args, dist.device, torch.float32, args.attn)
        self.policy = wrap_policy(self.lm, cfg.policy, dist, name=f"bench-{ac}")
        self.opt, self.sched = make_optimizer(self.policy, cfg.policy.optimizer)
        if args.sync_clip:
            self.opt.defaults["fused"] = False  # StepRunner then clips the old way; the optimizer itself stays fused

    def run(self, seq_len: int, batch: int, profile: bool) -> dict[str, Any]:
        args, dist = self.args, self.dist
        cfg = trainer_config(args, seq_len, batch, self.ac, dist.world_size)
        runner = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, dist, self.policy, None, self.opt, self.sched,
                            pad_multiple=64)
        plan = runner.plan(grpo_batch(batch * dist.world_size, seq_len, SHAPES[args.shape]["vocab_size"],
                                      args.mask == "agent"))
        t0 = time.perf_counter()
        runner.recompute(plan)
        torch.cuda.synchronize()
        first_recompute_s = time.perf_counter() - t0
        activations_gb, warm_s = None, []
        for i in range(args.warmup):
            probe = ActivationProbe(self.lm.model) if i == args.warmup - 1 else None
            warm_s.append(_sync_time(lambda: runner._update(plan[0]), 1))
            if probe is not None:
                activations_gb = probe.close()
        static_gb = torch.cuda.memory_allocated() / GIB  # parameters + gradients + Adam state, after a step
        recompute_s = _sync_time(lambda: runner.recompute(plan), 1)
        torch.cuda.reset_peak_memory_stats()
        dt = _sync_time(lambda: runner._update(plan[0]), args.steps)
        # The step sends only trained tokens through the lm_head (trainer.logprobs.trained_only).
        head = sum(trained_only(mb.packed, mb.mask).targets.numel() for mb in plan[0]) / (batch * seq_len)
        out: dict[str, Any] = _figures(batch * seq_len, dt, self.lm, seq_len, head)
        if profile and dist.is_main:
            out["profile"] = profile_step(lambda: runner._update(plan[0]))
        trained = sum(float((mb.mask != 0).sum()) for mb in plan[0])
        out.update(recompute_s=recompute_s, first_recompute_s=first_recompute_s, warmup_step_s=warm_s,
                   static_gb=static_gb, activations_gb=activations_gb, trained_token_fraction=trained / (
                       batch * (seq_len - 1)), padded_tokens=float(sum(mb.packed.padded_tokens for mb in plan[0])))
        c = self.lm.config
        out["logits_gb"] = logits_memory_gb(c.hidden_size, c.vocab_size, max(1, int(head * batch * seq_len)),
                                            chunk=args.chunk, saved_bytes=int(args.saved_grad_gb * GIB),
                                            device=dist.device)
        out["other_gb"] = out["peak_gb"] - static_gb - (activations_gb or 0.0) - out["logits_gb"]
        return out


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower() or "ALLOC_FAILED" in str(e)


def _guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`fn()`, or {"oom": True, ...} when it runs out of device memory (the memory is given back first)."""
    try:
        return fn()
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not _is_oom(e):
            raise
        return {"oom": True, "error": str(e).splitlines()[0][:240]}
    finally:
        gc.collect()
        torch.cuda.empty_cache()


class Report:
    def __init__(self, args: argparse.Namespace, dist: Dist) -> None:
        self.dist, self.t0 = dist, time.perf_counter()
        self.budget_s = args.budget_s
        default = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path.cwd()
        self.path = Path(args.out) if args.out else default / "trainer_gpu_bench.json"
        self.data: dict[str, Any] = {
            "device": torch.cuda.get_device_name(dist.device), "gpus": dist.world_size, "torch": torch.__version__,
            "shape": args.shape, "model": SHAPES[args.shape], "layers": args.layers or None,
            "compile": not args.no_compile, "mask": args.mask, "logprob_chunk_tokens": args.chunk,
            "logprob_saved_grad_gb": args.saved_grad_gb, "fsdp_reshard_after_forward": not args.keep_gathered,
            "sync_clip": args.sync_clip, "low_precision_residual": not args.fp32_residual,
            "static_vocab_head_kernels": not args.dynamic_vocab, "attn_implementation": args.attn,
            "steps": args.steps, "warmup": args.warmup, "peak_flops": PEAK_FLOPS,
            "tokens_per_s_is": "per GPU", "mfu_headline": "mfu_causal", "trainer": [], "naive": [],
        }

    def out_of_time(self) -> bool:
        return bool(self.budget_s) and time.perf_counter() - self.t0 > self.budget_s

    def add(self, kind: str, row: dict[str, Any]) -> None:
        row["elapsed_s"] = time.perf_counter() - self.t0
        self.data[kind].append(row)
        if self.dist.is_main:
            print(json.dumps({kind: row}), flush=True)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.data, indent=1))


def _run_mode(args: argparse.Namespace, ac: str, dist: Dist, report: Report) -> None:
    bench: TrainerBench | None = None
    oom_len = 1 << 40
    for seq_len, batch in configs(args):
        row: dict[str, Any] = {"seq_len": seq_len, "batch": batch, "ac": ac}
        if seq_len > oom_len or report.out_of_time():
            report.add("trainer", {**row, "skipped": "budget" if seq_len <= oom_len else "a shorter length OOM"})
            continue
        if bench is None:
            bench = TrainerBench(args, ac, dist)
        profile = args.profile == "all" or f"{seq_len}x{batch}:{ac}" in args.profile.split(",")

        def measure(b: TrainerBench = bench, s: int = seq_len, n: int = batch, p: bool = profile) -> dict[str, Any]:
            return b.run(s, n, p)

        row.update(_guarded(measure))
        oom_len = seq_len if row.get("oom") else oom_len
        report.add("trainer", row)
    if bench is not None:
        bench.opt.zero_grad(set_to_none=True)
        del bench
    gc.collect()
    torch.cuda.empty_cache()


def _cpu_shims() -> None:
    """--cpu-smoke: the CUDA calls the bench makes become no-ops (memory figures read 0), so every code path runs."""
    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        setattr(torch.cuda, name, lambda *_a, **_k: None)
    torch.cuda.get_device_name = lambda *_a, **_k: "cpu (smoke)"


def main() -> int:
    args = parse()
    env = read_env()
    device = pick_device(env)
    if device.type != "cuda" and not args.cpu_smoke:
        raise SystemExit("trainer_gpu_bench needs CUDA (or --cpu-smoke)")
    if args.cpu_smoke:
        _cpu_shims()
    if args.dynamic_vocab:
        import trainer.logprobs

        trainer.logprobs._static_vocab = lambda *_t: None
    torch.backends.cuda.matmul.allow_tf32 = True
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.assume_static_by_default = False  # dynamic sequence length from the first compile
    dist = Dist(env, device, timeout_s=1800)
    report = Report(args, dist)
    if not args.cpu_smoke:  # 5000 x 32000 logits: seconds on a GPU, a minute on a small CPU
        report.data["saved_vs_recomputed_logit_grads"] = check_logprob_grads(device)
    if args.attn_bench and dist.is_main:
        pairs = [(c.lower().split("x") + ["1"])[:2] for c in args.attn_bench.split(",")]
        report.data["attention"] = attention_bench(SHAPES[args.shape], [(int(s), int(b)) for s, b in pairs], device,
                                                   flex=not args.no_flex)
    if args.head_bench and dist.is_main:
        report.data["head_bench"] = head_bench(SHAPES[args.shape]["vocab_size"], args.head_bench, device)
    if args.logits_sweep and dist.is_main:
        shape = SHAPES[args.shape]
        report.data["logits_sweep"] = logits_sweep(shape["hidden_size"], shape["vocab_size"],
                                                   [int(n) for n in args.logits_sweep.split(",")],
                                                   [0.0, args.saved_grad_gb], chunk=args.chunk, device=device)
    oom_len = 0 if args.skip_naive else 1 << 40  # lengths above a length that ran out of memory are skipped
    for seq_len, batch in configs(args):
        row: dict[str, Any] = {"seq_len": seq_len, "batch": batch}
        if seq_len > oom_len or report.out_of_time():
            report.add("naive", {**row, "skipped": "skip-naive / shorter OOM / budget"})
            continue

        def naive(s: int = seq_len, n: int = batch) -> dict[str, Any]:
            return bench_naive(args, s, n, device)

        row.update(_guarded(naive))
        oom_len = seq_len if row.get("oom") else oom_len
        report.add("naive", row)
    for ac in filter(None, args.ac_modes.split(",")):  # "" measures no trainer (e.g. attention kernels only)
        _run_mode(args, ac, dist, report)
    if dist.is_main:
        print(f"wrote {report.path}", flush=True)
    dist.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
