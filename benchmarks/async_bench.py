"""Async vs sync GRPO through the whole fleet, on the learning demo (issues 7 and 8).

    python benchmarks/async_bench.py learn [--steps 40]        # sync and async, same seed and samples, plotted
    python benchmarks/async_bench.py scale [--workers 1,2,4]   # rollout workers: total and per-worker throughput

Each run is a real `grpo-fleet up` (embedded Redis, replay buffer, sandbox, vLLM rollout workers, torchrun trainer)
of `examples/configs/arith_learn.yaml`: the tiny Qwen2 with random weights learning small additions. That config
pins the trainer to core 0 and the rollout fleet (workers, vLLM engine cores, buffer) to core 1, so that on a 2-core
machine the comparison measures the design rather than contention between the fleets.

Figures, all from the trainer's metrics.jsonl (wall-clock stamps) and the workers' summaries
(`<run>/logs/workers/*.json`), counted from the trainer's first record (fleet up, first weights pushed), so the
engines' start-up time is not in them:
- wall-clock for K steps, train tokens/s, speedup = sync / async;
- the limit: T_train alone = the sync run's train step + weight push (nothing else runs then); T_rollout alone = the
  async worker's busy seconds (groups in flight, generation+scoring) per step's worth of groups, i.e. the rollout
  fleet's own pace when it never waits for the trainer. Overlap efficiency = max(T_rollout, T_train) / T_async_step
  (1.0 = the async step costs no more than its slower half). Medians over the steps after the warm-up. The sync
  run's wait for data is reported too: it is larger than T_rollout because each sync step starts the pipeline
  empty (lease, then a batch that only fills as groups arrive);
- where time goes per step (trainer: waiting for data, recomputing log-probs, training, pushing) and the workers'
  busy / idle / paused seconds;
- learning: reward and accuracy per step, and when async first reaches the sync run's final reward.

Results: benchmarks/results/async_learn.json (+ docs/img/arith_learning.png), benchmarks/results/async_scale.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from trainer.metrics import read_jsonl  # noqa: E402

CONFIG = ROOT / "examples/configs/arith_learn.yaml"
RESULTS = ROOT / "benchmarks/results"
WARMUP = 3  # steps left out of per-step means: first compiles, first pushes, queues filling


def run_fleet(name: str, work: Path, steps: int, overrides: list[str], config: Path,
              timeout_s: float) -> dict[str, Any]:
    rd = work / name
    if rd.exists():
        subprocess.run(["rm", "-rf", str(rd)], check=True)
    log_path = work / f"{name}.log"
    cmd = [sys.executable, "-m", "launch.cli", "up", "--config", str(config), f"run.dir={rd}",
           "logger.progress_bar=false", f"grpo.max_num_steps={steps}", *overrides]
    print(f"[{name}] {' '.join(cmd[2:])}  (log: {log_path})", flush=True)
    t0 = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        tail = log_path.read_text().splitlines()[-30:]
        raise RuntimeError(f"{name}: grpo-fleet up exited with {proc.returncode}; last lines:\n" + "\n".join(tail))
    return summarize(name, rd, overrides, time.monotonic() - t0)


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(name: str, rd: Path, overrides: list[str], launcher_s: float) -> dict[str, Any]:
    records = read_jsonl(rd / "logs/metrics.jsonl")
    records = [r for r in records if "histogram" not in r]
    t0 = min(r["time"] for r in records)
    steps = []
    for r in records:
        if "reward/mean" not in r:
            continue
        steps.append({
            "step": r["step"], "t": r["time"] - t0, "reward": r["reward/mean"],
            "resolved": r.get("reward/resolved_frac", 0.0), "train_tokens": r.get("perf/train_tokens", 0.0),
            "groups": r.get("data/groups", 0.0),
            "wait_data_s": r.get("timing/wait_data_s", 0.0), "train_step_s": r.get("timing/train_step_s", 0.0),
            "logprob_recompute_s": r.get("timing/logprob_recompute_s", 0.0), "train_s": r.get("timing/train_s", 0.0),
            "push_wait_s": r.get("timing/push_wait_s", 0.0), "push_s": r.get("weights/push_s"),
            "pause_s": r.get("weights/max_pause_s"), "ages": r.get("age/max"),
        })
    steps.sort(key=lambda s: s["step"])
    if not steps:
        raise RuntimeError(f"{name}: no training step in {rd / 'logs/metrics.jsonl'}")
    wall = steps[-1]["t"]
    steady = steps[WARMUP:] or steps
    # The steady pace: wall-clock per step after the warm-up, overlap included (consecutive async steps alternate
    # short and long as groups arrive in bursts, so a median of gaps would flatter it).
    first = steps[WARMUP - 1] if len(steps) > WARMUP else {"t": 0.0}
    pace = (steps[-1]["t"] - first["t"]) / max(1, len(steps) - WARMUP if len(steps) > WARMUP else len(steps))
    workers = [json.loads(p.read_text()) for p in sorted((rd / "logs/workers").glob("*.json"))]
    return {
        "name": name, "overrides": overrides, "launcher_s": launcher_s, "steps": steps, "wall_s": wall,
        "train_tokens_per_s": sum(s["train_tokens"] for s in steps) / wall,
        "step_s": pace,
        "per_step": {k: _median([s[k] for s in steady if s[k] is not None])
                     for k in ("wait_data_s", "logprob_recompute_s", "train_s", "train_step_s", "push_wait_s",
                               "push_s", "pause_s")},
        "trainer_idle_frac": sum(s["wait_data_s"] for s in steps) / wall,
        "final_reward": _mean([s["reward"] for s in steps[-5:]]),
        "final_resolved": _mean([s["resolved"] for s in steps[-5:]]),
        "workers": workers,
    }


def time_to_reach(run: dict[str, Any], target: float, window: int = 5) -> float | None:
    """Wall-clock at which the reward's trailing mean over `window` steps first reaches `target`."""
    rewards = [s["reward"] for s in run["steps"]]
    for i in range(window - 1, len(rewards)):
        if _mean(rewards[i - window + 1:i + 1]) >= target:
            return float(run["steps"][i]["t"])
    return None


def plot_learning(sync: dict[str, Any], asyn: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for run, color, label in ((sync, "tab:blue", "sync"), (asyn, "tab:orange", "async (max age 2, in-flight)")):
        st = run["steps"]
        for ax, xs in ((axes[0], [s["step"] + 1 for s in st]), (axes[1], [s["t"] for s in st])):
            ax.plot(xs, [s["reward"] for s in st], color=color, label=f"{label}: reward")
            ax.plot(xs, [s["resolved"] for s in st], color=color, linestyle="--", label=f"{label}: accuracy")
    axes[0].set_xlabel("training step")
    axes[1].set_xlabel("wall-clock seconds (from the first weights pushed)")
    for ax in axes:
        ax.set_ylabel("training reward / accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("tiny Qwen2 (random init) learning arith through the fleet, 2 CPU cores")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def learn(args: argparse.Namespace) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    sync_overrides = ["grpo.async_grpo.enabled=false", "grpo.async_grpo.in_flight_weight_updates=false"]
    if args.reuse:  # re-read finished runs (e.g. after changing this summary), run nothing
        sync, asyn = summarize("sync", work / "sync", sync_overrides, 0.0), summarize("async", work / "async", [], 0.0)
    else:
        sync = run_fleet("sync", work, args.steps, sync_overrides, Path(args.config), args.timeout)
        asyn = run_fleet("async", work, args.steps, [], Path(args.config), args.timeout)
    # Training alone: the trainer's own core, so its step in the async run is training alone (and its sync-run figure
    # is reported too: on a quiet machine they agree; when they differ, other load disturbed one run).
    t_train = asyn["per_step"]["train_step_s"] + asyn["per_step"]["push_wait_s"]
    t_train_sync = sync["per_step"]["train_step_s"] + sync["per_step"]["push_wait_s"]
    # Steps' worth of groups the async workers produced (some are left in the buffer at the end).
    step_groups = sum(w["groups_submitted"] for w in asyn["workers"]) / _median([s["groups"] for s in asyn["steps"]])
    t_rollout = sum(w["busy_s"] for w in asyn["workers"]) / step_groups
    reach = time_to_reach(asyn, sync["final_reward"])
    result = {
        "env": env_info(), "config": str(Path(args.config).relative_to(ROOT)), "steps": args.steps,
        "sync": sync, "async": asyn,
        "speedup_wall": sync["wall_s"] / asyn["wall_s"],
        "speedup_steady": sync["step_s"] / asyn["step_s"],
        "t_rollout_alone_s": t_rollout, "t_train_alone_s": t_train,
        "sync_wait_for_data_s": sync["per_step"]["wait_data_s"], "t_train_in_sync_run_s": t_train_sync,
        # Sync's pace had its training taken as long as in the async run: the speedup the design alone explains.
        "speedup_steady_same_train_time": (sync["per_step"]["wait_data_s"] + t_train) / asyn["step_s"],
        "overlap_efficiency": max(t_rollout, t_train) / asyn["step_s"],
        "sync_final_reward": sync["final_reward"], "async_reaches_it_at_s": reach, "sync_reaches_it_at_s":
            time_to_reach(sync, sync["final_reward"]),
    }
    out = RESULTS / "async_learn.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot_learning(sync, asyn, ROOT / "docs/img/arith_learning.png")
    print(json.dumps({k: v for k, v in result.items() if k not in ("sync", "async", "env")}, indent=1))
    for run in (sync, asyn):
        print(run["name"], "wall", round(run["wall_s"], 1), "step_s", round(run["step_s"], 2),
              {k: round(v, 3) for k, v in run["per_step"].items()}, "trainer idle", round(run["trainer_idle_frac"], 3),
              "reward", round(run["final_reward"], 3), "acc", round(run["final_resolved"], 3))
    print(f"results: {out}")


def scale(args: argparse.Namespace) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for n in [int(x) for x in args.workers.split(",")]:
        run = run_fleet(f"workers-{n}", work, args.steps, [f"rollout.num_workers={n}"], Path(args.config),
                        args.timeout)
        tokens = sum(w["tokens_generated"] for w in run["workers"])
        busy = [w["busy_s"] for w in run["workers"]]
        runs.append({
            "workers": n, "wall_s": run["wall_s"], "step_s": run["step_s"],
            "generated_tokens_per_s": tokens / run["wall_s"],
            "per_worker_tokens_per_s": [w["tokens_generated"] / run["wall_s"] for w in run["workers"]],
            "worker_busy_frac": [b / run["wall_s"] for b in busy],
            "trainer_idle_frac": run["trainer_idle_frac"], "per_step": run["per_step"],
        })
        print(json.dumps(runs[-1]), flush=True)
    out = RESULTS / "async_scale.json"
    out.write_text(json.dumps({"env": env_info(), "steps": args.steps, "runs": runs}, indent=1) + "\n")
    print(f"results: {out}")


def env_info() -> dict[str, Any]:
    import os
    import platform

    return {"machine": platform.machine(), "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "loadavg_1m": os.getloadavg()[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["learn", "scale"])
    p.add_argument("--steps", type=int, default=None, help="training steps per run (learn: 80, scale: 12)")
    p.add_argument("--workers", default="1,2,4", help="scale: worker counts")
    p.add_argument("--config", default=str(CONFIG))
    p.add_argument("--work", default="/tmp/grpo-fleet-async-bench", help="run directories and logs")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one fleet run may take")
    p.add_argument("--reuse", action="store_true", help="learn: summarize the runs already in --work, run nothing")
    args = p.parse_args()
    if args.steps is None:
        args.steps = 80 if args.what == "learn" else 12
    RESULTS.mkdir(parents=True, exist_ok=True)
    (learn if args.what == "learn" else scale)(args)


if __name__ == "__main__":
    main()
