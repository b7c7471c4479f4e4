"""Trainer throughput on GPUs: our training step vs a naive transformers loop, in the same process.

    torchrun --nproc-per-node=1 benchmarks/trainer_gpu_bench.py [--out results.json]
    torchrun --nproc-per-node=2 benchmarks/trainer_gpu_bench.py --batch-sizes 4

Model: Qwen2 shape of the issue (~0.5B: hidden 896, 24 layers, 14 heads, 2 KV heads, MLP 4864, vocab 151936, tied
embeddings), random weights, sequences of --seq-len tokens.

* naive: bf16 parameters, sdpa, `model(ids, labels=ids).loss.backward()`, fused AdamW; no compile, no FSDP. Each
  rank runs it alone (no gradient sync): it is the per-GPU baseline.
* trainer: the real code path of trainer.step.StepRunner. One GPU: fp32 masters under bf16 autocast; several:
  FSDP2 over all ranks with a bf16 MixedPrecisionPolicy. Per-layer torch.compile, the fused chunked lm_head +
  log-softmax (logit gradients saved in the forward up to --saved-grad-gb), packing, the GRPO loss with IS
  correction, clipping (one GPU: inside the fused AdamW, no host sync), fused AdamW. Each sample is a 1-token prompt +
  (seq_len - 1) response tokens, so both loops put every position through the lm_head. Old log-probs are recomputed
  once, outside the timed region (the naive loop has no such pass); `recompute_s` reports that forward pass.

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
    p.add_argument("--keep-gathered", action="store_true",
                   help="policy.fsdp_reshard_after_forward=false (several GPUs: no re-gather in the backward)")
    p.add_argument("--chunk", type=int, default=4096, help="policy.logprob_chunk_tokens")
    p.add_argument("--saved-grad-gb", type=float, default=8.0,
                   help="policy.logprob_saved_grad_gb (0: the backward recomputes the lm_head logits)")
    p.add_argument("--sync-clip", action="store_true",
                   help="ablation: clip with clip_grad_norm_ and a host sync before the optimizer step (the path "
                        "several ranks take) instead of inside the fused AdamW")
    p.add_argument("--skip-naive", action="store_true")
    p.add_argument("--profile", action="store_true", help="print the top CUDA kernels of one trainer step")
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
    return out


def _figures(tokens: int, dt: float, fpt: float) -> dict[str, float]:
    tps = tokens / dt
    return {"step_s": dt, "tokens_per_s": tps, "mfu": tps * fpt / PEAK_FLOPS,
            "peak_mem_gb": torch.cuda.max_memory_allocated() / 2**30}


def trainer_config(args: argparse.Namespace, batch: int, world: int) -> Any:
    """The trainer config of the measurement: MasterConfig where pydantic is installed; otherwise (the lent GPU
    machines have torch and transformers only) a stand-in carrying the same values for the keys the step reads."""
    values = {
        "policy.precision": "bfloat16", "policy.compile": not args.no_compile,
        "policy.activation_checkpointing": args.activation_checkpointing,
        "policy.logprob_chunk_tokens": args.chunk, "policy.fsdp_reshard_after_forward": not args.keep_gathered,
        "policy.logprob_saved_grad_gb": args.saved_grad_gb,
        "policy.max_total_sequence_length": args.seq_len,
        "policy.generation.max_new_tokens": 16, "policy.train_global_batch_size": batch * world,
        "policy.train_micro_batch_size": batch, "grpo.num_prompts_per_step": batch * world,
        "grpo.num_generations_per_prompt": 1, "policy.optimizer.lr": 1e-6,
        "loss_fn.reference_policy_kl_penalty": 0.0, "loss_fn.use_importance_sampling_correction": True,
        "loss_fn.truncated_importance_sampling_type": "tis", "loss_fn.truncated_importance_sampling_ratio": 2.0,
    }
    try:
        from fleet.config import parse_config
    except ImportError:
        return _standin(values)
    return parse_config({}, [f"{k}={json.dumps(v)}" for k, v in values.items()])


def _standin(values: dict[str, Any]) -> Any:
    from types import SimpleNamespace

    loss = {"reference_policy_kl_penalty": 0.0, "reference_policy_kl_type": "k3", "ratio_clip_min": 0.2,
            "ratio_clip_max": 0.2, "ratio_clip_c": None, "use_importance_sampling_correction": False,
            "truncated_importance_sampling_type": None, "truncated_importance_sampling_ratio": None,
            "truncated_importance_sampling_ratio_min": None, "sequence_level_importance_ratios": False,
            "token_level_loss": True, "kl_score_function_gradient": True, "tis_clamps_below": True}
    loss.update({k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("loss_fn.")})
    optimizer = SimpleNamespace(lr=values["policy.optimizer.lr"], betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                                warmup_steps=0)
    policy = SimpleNamespace(
        precision=values["policy.precision"], compile=values["policy.compile"],
        activation_checkpointing=values["policy.activation_checkpointing"],
        logprob_chunk_tokens=values["policy.logprob_chunk_tokens"], attn_implementation="sdpa",
        logprob_saved_grad_gb=values["policy.logprob_saved_grad_gb"],
        fsdp_reshard_after_forward=values["policy.fsdp_reshard_after_forward"],
        max_total_sequence_length=values["policy.max_total_sequence_length"], sequence_packing=True,
        train_global_batch_size=values["policy.train_global_batch_size"],
        train_micro_batch_size=values["policy.train_micro_batch_size"], max_grad_norm=1.0, optimizer=optimizer)
    return SimpleNamespace(policy=policy, loss_fn=SimpleNamespace(**loss))


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
    if args.sync_clip:
        opt.defaults["fused"] = False  # StepRunner then clips the old way; the optimizer itself stays fused
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
    if args.profile and dist.is_main:
        _profile(lambda: runner._update(plan[0]))
    out = _figures(batch * args.seq_len, dt, fpt)  # per GPU
    out.update(recompute_s=recompute_s, first_recompute_s=first_recompute_s,
               padded_tokens=float(sum(mb.packed.padded_tokens for mb in plan[0])))
    return out


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


def _profile(fn: Any) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=60), flush=True)


def main() -> int:
    args = parse()
    env = read_env()
    device = pick_device(env)
    if device.type != "cuda":
        raise SystemExit("trainer_gpu_bench needs CUDA")
    torch.backends.cuda.matmul.allow_tf32 = True
    dist = Dist(env, device, timeout_s=1800)
    results = []
    check = check_logprob_grads(device)
    if dist.is_main:
        print(json.dumps({"saved_vs_recomputed_logit_grads": check}), flush=True)
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
        "fsdp_reshard_after_forward": not args.keep_gathered, "logprob_saved_grad_gb": args.saved_grad_gb,
        "sync_clip": args.sync_clip, "saved_vs_recomputed_logit_grads": check,
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
