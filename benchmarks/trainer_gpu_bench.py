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
    attention_bench,
    check_logprob_grads,
    flops_per_token,
    logits_memory_gb,
    logits_sweep,
    observation_spans,
    profile_kernels,
)

from trainer.batch import Group, Trajectory, build_step_batch  # noqa: E402
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
    p.add_argument("--profile", default="", help="LENxBATCH:MODE of one trainer measurement to profile (kernels)")
    p.add_argument("--attn-bench", default="", help="sequence lengths of the attention-kernel microbenchmark")
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


def qwen2(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = SHAPES[args.shape]
    kw: dict[str, Any] = {**shape, "num_hidden_layers": args.layers or shape["num_hidden_layers"],
                          "tie_word_embeddings": True, "max_position_embeddings": 262144, "use_cache": False,
                          "attn_implementation": "sdpa"}
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


def trainer_config(args: argparse.Namespace, seq_len: int, batch: int, ac: str, world: int) -> Any:
    """The trainer config of the measurement: MasterConfig where pydantic is installed; otherwise (the lent GPU
    machines have torch and transformers only) a stand-in carrying the same values for the keys the step reads."""
    values = {
        "policy.precision": "bfloat16", "policy.compile": not args.no_compile,
        "policy.activation_checkpointing": ac != "none",
        "policy.activation_checkpointing_scope": "layer" if ac == "none" else ac,
        "policy.logprob_chunk_tokens": args.chunk, "policy.fsdp_reshard_after_forward": not args.keep_gathered,
        "policy.logprob_saved_grad_gb": args.saved_grad_gb,
        "policy.max_total_sequence_length": seq_len,
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
        activation_checkpointing_scope=values["policy.activation_checkpointing_scope"],
        logprob_chunk_tokens=values["policy.logprob_chunk_tokens"], attn_implementation="sdpa",
        logprob_saved_grad_gb=values["policy.logprob_saved_grad_gb"],
        fsdp_reshard_after_forward=values["policy.fsdp_reshard_after_forward"],
        max_total_sequence_length=values["policy.max_total_sequence_length"], sequence_packing=True,
        train_global_batch_size=values["policy.train_global_batch_size"],
        train_micro_batch_size=values["policy.train_micro_batch_size"], max_grad_norm=1.0, optimizer=optimizer)
    return SimpleNamespace(policy=policy, loss_fn=SimpleNamespace(**loss))


def grpo_batch(n: int, seq_len: int, vocab: int, agent: bool) -> Any:
    g = torch.Generator().manual_seed(0)
    groups = []
    for i in range(n):
        resp = torch.randint(0, vocab, (seq_len - 1,), generator=g).tolist()
        # -11.9 ~ log(1 / vocab): random weights give about that, so the IS weights stay near 1.
        spans = observation_spans(len(resp), seed=i) if agent else []
        traj = Trajectory(resp, [-11.9] * len(resp), [0] * len(resp), float(i % 2), observation_spans=spans)
        groups.append(Group(f"0:{i}", [1], [traj], 0))
    # One generation per group gives zero advantages; give them signs so the loss has a gradient.
    batch = build_step_batch(groups, 0, leave_one_out=False, normalize=False, max_len=seq_len)
    for i, s in enumerate(batch.samples):
        s.advantage = 1.0 if i % 2 else -1.0
    return batch


class TrainerBench:
    """One policy + optimizer for one activation-checkpointing mode, measured at several lengths."""

    def __init__(self, args: argparse.Namespace, ac: str, dist: Dist) -> None:
        self.args, self.ac, self.dist = args, ac, dist
        cfg = trainer_config(args, 4096, 1, ac, dist.world_size)
        self.lm = qwen2(args, dist.device, torch.float32)
        self.policy = wrap_policy(self.lm, cfg.policy, dist, name=f"bench-{ac}")
        self.opt, self.sched = make_optimizer(self.policy, cfg)
        if args.sync_clip:
            self.opt.defaults["fused"] = False  # StepRunner then clips the old way; the optimizer itself stays fused

    def run(self, seq_len: int, batch: int, profile: bool) -> dict[str, Any]:
        args, dist = self.args, self.dist
        cfg = trainer_config(args, seq_len, batch, self.ac, dist.world_size)
        runner = StepRunner(cfg, dist, self.policy, None, self.opt, self.sched, pad_multiple=64)
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
            out["kernels"] = profile_kernels(lambda: runner._update(plan[0]))
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
            "sync_clip": args.sync_clip, "steps": args.steps, "warmup": args.warmup, "peak_flops": PEAK_FLOPS,
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
        profile = args.profile == f"{seq_len}x{batch}:{ac}"

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


def main() -> int:
    args = parse()
    env = read_env()
    device = pick_device(env)
    if device.type != "cuda":
        raise SystemExit("trainer_gpu_bench needs CUDA")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.assume_static_by_default = False  # dynamic sequence length from the first compile
    dist = Dist(env, device, timeout_s=1800)
    report = Report(args, dist)
    report.data["saved_vs_recomputed_logit_grads"] = check_logprob_grads(device)
    if args.attn_bench and dist.is_main:
        report.data["attention"] = attention_bench(SHAPES[args.shape], [int(s) for s in args.attn_bench.split(",")],
                                                   device)
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
