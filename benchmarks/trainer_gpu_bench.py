"""Trainer throughput on GPUs: our training step vs a naive transformers loop, in the same process.

    torchrun --nproc-per-node=1 benchmarks/trainer_gpu_bench.py [--out results.json]
    torchrun --nproc-per-node=2 benchmarks/trainer_gpu_bench.py --batch-sizes 4

Model: Qwen2 shape of the issue (~0.5B: hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, vocab 151936, tied
embeddings), random weights, sequences of --seq-len tokens.

* naive: bf16 parameters, sdpa, `model(ids, labels=ids).loss.backward()`, fused AdamW; no compile, no FSDP. Each
  rank runs it alone (no gradient sync): it is the per-GPU baseline.
* trainer: the real code path of trainer.step.StepRunner (FSDP2 over all ranks, fp32 masters with bf16
  MixedPrecisionPolicy, per-layer torch.compile, fused chunked lm_head + log-softmax, packing, GRPO loss with IS
  correction, clipping, fused AdamW). Each sample is a 1-token prompt + (seq_len - 1) response tokens, so both loops
  put every position through the lm_head. Old log-probs are recomputed once, outside the timed region (the naive
  loop has no such pass); `recompute_s` reports that forward pass separately.

MFU = model FLOPs / time / peak: per token 6 * N (N = all parameters, the tied embedding counted once: it is the lm_head
matmul) + 12 * layers * hidden * seq_len for attention (no causal discount; the convention behind the issue's
baseline numbers). Peak: 989 TFLOP/s dense bf16 (H100/H200 SXM).

Writes JSON to --out, else $OUT/trainer_gpu_bench.json, else ./trainer_gpu_bench.json (rank 0).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from trainer.batch import Group, Trajectory, build_step_batch  # noqa: E402
from trainer.dist import Dist, pick_device, read_env  # noqa: E402
from trainer.model import wrap_policy  # noqa: E402
from trainer.step import StepRunner, make_optimizer  # noqa: E402

PEAK_FLOPS = 989e12
SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
             intermediate_size=4864, vocab_size=151936)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch-sizes", default="1,4", help="samples per GPU per step, comma-separated")
    p.add_argument("--steps", type=int, default=10, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile happens here)")
    p.add_argument("--layers", type=int, default=SHAPE["num_hidden_layers"], help="fewer layers for a smoke test")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--chunk", type=int, default=4096, help="policy.logprob_chunk_tokens")
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--out", default=None)
    return p.parse_args()


def qwen2(layers: int, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**{**SHAPE, "num_hidden_layers": layers}, tie_word_embeddings=True,
                      max_position_embeddings=32768, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    return model.to(dtype)


def flops_per_token(model: Any, seq_len: int) -> float:
    n = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    c = model.config
    return 6.0 * n + 12.0 * c.num_hidden_layers * c.hidden_size * seq_len


def _sync_time(fn: Any, steps: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def bench_naive(args: argparse.Namespace, batch: int, device: torch.device) -> dict[str, float]:
    model = qwen2(args.layers, device, torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    ids = torch.randint(0, SHAPE["vocab_size"], (batch, args.seq_len), device=device)

    def step() -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    torch.cuda.reset_peak_memory_stats()
    dt = _sync_time(step, args.steps)
    fpt = flops_per_token(model, args.seq_len)
    out = _figures(batch * args.seq_len, dt, fpt)
    del model, opt
    return out


def _figures(tokens: int, dt: float, fpt: float) -> dict[str, float]:
    tps = tokens / dt
    return {"step_s": dt, "tokens_per_s": tps, "mfu": tps * fpt / PEAK_FLOPS,
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30}


def trainer_config(args: argparse.Namespace, batch: int, world: int) -> Any:
    from fleet.config import parse_config

    return parse_config({}, [
        "policy.precision=bfloat16", f"policy.compile={not args.no_compile}",
        f"policy.activation_checkpointing={args.activation_checkpointing}",
        f"policy.logprob_chunk_tokens={args.chunk}", f"policy.max_total_sequence_length={args.seq_len}",
        "policy.generation.max_new_tokens=16", f"policy.train_global_batch_size={batch * world}",
        f"policy.train_micro_batch_size={batch}", f"grpo.num_prompts_per_step={batch * world}",
        "grpo.num_generations_per_prompt=1", "policy.optimizer.lr=1e-6", "loss_fn.reference_policy_kl_penalty=0",
        "loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=tis",
        "loss_fn.truncated_importance_sampling_ratio=2.0",
    ])


def grpo_batch(n: int, seq_len: int) -> Any:
    g = torch.Generator().manual_seed(0)
    groups = []
    for i in range(n):
        resp = torch.randint(0, SHAPE["vocab_size"], (seq_len - 1,), generator=g).tolist()
        traj = Trajectory(resp, [-11.9] * len(resp), [0] * len(resp), float(i % 2))
        groups.append(Group(f"0:{i}", [1], [traj], 0))
    # One generation per group gives zero advantages; give them signs so the loss has a gradient.
    batch = build_step_batch(groups, 0, leave_one_out=False, normalize=False, max_len=seq_len)
    for i, s in enumerate(batch.samples):
        s.advantage = 1.0 if i % 2 else -1.0
    return batch


def bench_trainer(args: argparse.Namespace, batch: int, dist: Dist) -> dict[str, float]:
    cfg = trainer_config(args, batch, dist.world_size)
    lm = qwen2(args.layers, dist.device, torch.float32)
    fpt = flops_per_token(lm, args.seq_len)
    policy = wrap_policy(lm, cfg.policy, dist, name="bench")
    opt, sched = make_optimizer(policy, cfg)
    runner = StepRunner(cfg, dist, policy, None, opt, sched, pad_multiple=64)
    plan = runner.plan(grpo_batch(batch * dist.world_size, args.seq_len))
    t0 = time.perf_counter()
    runner.recompute(plan)
    torch.cuda.synchronize()
    first_recompute_s = time.perf_counter() - t0
    for _ in range(args.warmup):
        runner._update(plan[0])
    torch.cuda.reset_peak_memory_stats()
    recompute_s = _sync_time(lambda: runner.recompute(plan), 1)
    dt = _sync_time(lambda: runner._update(plan[0]), args.steps)
    out = _figures(batch * args.seq_len, dt, fpt)  # per GPU
    out.update(recompute_s=recompute_s, first_recompute_s=first_recompute_s,
               padded_tokens=float(sum(mb.packed.padded_tokens for mb in plan[0])))
    del policy, opt, runner, plan, lm
    return out


def main() -> int:
    args = parse()
    env = read_env()
    device = pick_device(env)
    if device.type != "cuda":
        raise SystemExit("trainer_gpu_bench needs CUDA")
    torch.backends.cuda.matmul.allow_tf32 = True
    dist = Dist(env, device, timeout_s=1800)
    results = []
    for batch in [int(b) for b in args.batch_sizes.split(",")]:
        row: dict[str, Any] = {"batch_per_gpu": batch}
        if not args.skip_naive:
            row["naive"] = bench_naive(args, batch, device)
            gc.collect()
            torch.cuda.empty_cache()
        row["trainer"] = bench_trainer(args, batch, dist)
        gc.collect()
        torch.cuda.empty_cache()
        if "naive" in row:
            row["speedup"] = row["trainer"]["tokens_per_s"] / row["naive"]["tokens_per_s"]
        if dist.is_main:
            print(json.dumps(row), flush=True)
        results.append(row)
    report = {
        "device": torch.cuda.get_device_name(device), "gpus": dist.world_size, "torch": torch.__version__,
        "seq_len": args.seq_len, "layers": args.layers, "compile": not args.no_compile,
        "activation_checkpointing": args.activation_checkpointing, "logprob_chunk_tokens": args.chunk,
        "peak_flops": PEAK_FLOPS, "tokens_per_s_is": "per GPU", "results": results,
    }
    if dist.is_main:
        default = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path.cwd()
        out = Path(args.out) if args.out else default / "trainer_gpu_bench.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        print(f"wrote {out}", flush=True)
    dist.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
