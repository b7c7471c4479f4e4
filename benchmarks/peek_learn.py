"""The tiny model learns to answer with a tool's result through the whole fleet: `peek` (envs/peek.py), issue 17.

    .venv/bin/python benchmarks/agent_bench.py peek [--max-s 900] [--pretrain-only] [overrides...]

1. **Base** (`lookup_copy.peek_base`, `workshop/pretrain.py`): `tiny-qwen2` (random weights) with `<tool_call>` /
   `</tool_call>` added as single tokens (as in real Qwen tokenizers), pre-trained `--pre-steps` AdamW steps of
   `--pre-batch` peek episodes whose answer is a **random** digit, independent of the tool's result: it calls the
   tool and answers a digit, right at chance (1/10). Its greedy rates on the held-out tasks are measured here too.
2. **GRPO through the fleet**: `grpo-fleet up --config examples/configs/peek_learn.yaml` (embedded Redis, replay
   buffer, one vLLM rollout worker running the two-turn episodes with the tool in-process, the torchrun trainer with
   observation tokens masked out of the loss), sync, validation (greedy, 200 held-out tasks) every
   `grpo.val_period` steps. Stopped once validation has reached `--target` and `--after` more rounds were logged, or
   after `--max-s` seconds.
3. Results: benchmarks/results/lookup_peek.json (per step: reward, success, turns, tool-call error rate; per round:
   validation; the load average every 30 s), plot docs/img/agent_lookup_peek.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from trainer.metrics import read_jsonl  # noqa: E402

CONFIG = ROOT / "examples/configs/peek_learn.yaml"
BASE = ROOT / ".cache/models/tiny-qwen2-peek-format"
RESULTS = ROOT / "benchmarks/results/lookup_peek.json"
PLOT = ROOT / "docs/img/agent_lookup_peek.png"


def base_rates(base: Path) -> dict[str, float]:
    """Greedy success / tool use / answered of `base` on the held-out tasks (the sketch's exact evaluation)."""
    import torch
    from lookup_copy import evaluate, make_tasks
    from transformers import AutoModelForCausalLM

    from envs.agent.chat import ChatFormat
    from fleet.tokenizer import load_tokenizer

    torch.set_num_threads(1)
    tok = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    return evaluate(model, ChatFormat(tok), make_tasks("peek", 1, "validation", 200))


def run_fleet(work: Path, overrides: list[str], args: argparse.Namespace) -> dict[str, Any]:
    rd = work / "peek"
    if rd.exists():
        subprocess.run(["rm", "-rf", str(rd)], check=True)
    log_path = work / "peek.log"
    # `--tree`: the fleet's code from a snapshot (e.g. `git archive HEAD`), so that edits in progress in the shared
    # checkout cannot break the run (as benchmarks/skill_demo.py does); models stay in this checkout's cache.
    code = args.tree or ROOT
    env = {**os.environ, "PYTHONPATH": str(code), "GRPO_FLEET_CACHE": str(ROOT / ".cache")}
    if args.tree and not (code / "grpofleet").is_dir():  # generated gRPC code is not in git
        subprocess.run([sys.executable, "-m", "fleet.protogen"], cwd=code, env=env, check=True)
    cmd = [sys.executable, "-m", "launch.cli", "up", "--config", str(code / CONFIG.relative_to(ROOT)),
           f"run.dir={rd}", "logger.progress_bar=false", *overrides]
    print(f"[peek] {' '.join(cmd[3:])}  (log: {log_path})", flush=True)
    t0, loads, why = time.monotonic(), [], ""
    metrics = rd / "logs/metrics.jsonl"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            time.sleep(5)
            if not loads or time.monotonic() - t0 - loads[-1]["t"] >= 30:
                loads.append({"t": round(time.monotonic() - t0), "load1": os.getloadavg()[0]})
            if why:
                continue
            accs = [r["val/accuracy"] for r in read_jsonl(metrics) if "val/accuracy" in r]
            hit = next((i for i, a in enumerate(accs) if a >= args.target), None)
            why = ("target reached" if hit is not None and len(accs) - 1 - hit >= args.after
                   else "max-s" if time.monotonic() - t0 > args.max_s else "")
            if why:
                print(f"  stopping the fleet: {why}", flush=True)
                proc.terminate()  # SIGTERM: the fleet shuts down cleanly
        proc.wait()
    if proc.returncode != 0 and not why:
        tail = log_path.read_text().splitlines()[-30:]
        raise RuntimeError(f"grpo-fleet up exited with {proc.returncode}; last lines:\n" + "\n".join(tail))
    return {**summarize(metrics), "launcher_s": round(time.monotonic() - t0, 1), "stopped": why, "load": loads}


def summarize(metrics: Path) -> dict[str, Any]:
    records = read_jsonl(metrics)
    records = [r for r in records if "histogram" not in r]
    t0 = min(r["time"] for r in records)
    train = [{"step": r["step"] + 1, "t": round(r["time"] - t0, 1), "reward": r["reward/mean"],
              "success": r.get("reward/resolved_frac"), "turns": r.get("agent/turns_mean"),
              "tool_error_rate": r.get("agent/tool_error_rate"), "step_s": r.get("timing/step_s"),
              "tmpe": r.get("loss/token_mult_prob_error"), "zero_std": r.get("data/zero_std_groups_frac"),
              "response_len": r.get("data/response_len_mean")}
             for r in records if "reward/mean" in r]
    # val/step: the number of steps the validated weights have trained (0: the base model).
    val = [{"step": int(r["val/step"]), "t": round(r["time"] - t0, 1), "success": r["val/accuracy"]}
           for r in records if "val/accuracy" in r]
    train.sort(key=lambda s: s["step"])
    val.sort(key=lambda v: v["step"])
    steps_s = [s["step_s"] for s in train if s["step_s"]]
    return {"train": train, "val": val, "steps": len(train), "wall_s": train[-1]["t"] if train else None,
            "step_s_median": statistics.median(steps_s) if steps_s else None}


def plot(result: dict[str, Any], path: Path, title: str = "format base, random answers") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = result["run"]
    tr, va = run["train"], run["val"]
    xs = [s["step"] for s in tr]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([v["step"] for v in va], [v["success"] for v in va], marker="o", color="tab:green",
                 label="validation success (greedy, 200 held-out tasks)")
    axes[0].plot(xs, [s["reward"] for s in tr], color="tab:blue", alpha=0.5, label="training reward (binary)")
    axes[0].axhline(0.1, color="grey", linestyle=":", label="chance (1/10)")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("success rate / reward")
    axes[1].plot(xs, [s["turns"] for s in tr], color="tab:orange", label="turns per episode (2 = read, answer)")
    axes[1].set_ylim(0, 2.2)
    axes[2].plot(xs, [s["tool_error_rate"] for s in tr], color="tab:red", label="tool-call error rate")
    axes[2].set_ylim(-0.02, 1.02)
    for ax in axes:
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="center right")
    fig.suptitle(f"tiny Qwen2 ({title}), GRPO on peek through the fleet (16x16 "
                 f"episodes/step, binary success): {run['steps']} steps, {run['wall_s']:.0f} s on 2 shared CPU cores",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    from lookup_copy import peek_base, peek_tooluse_base

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pre-steps", type=int, default=150)
    ap.add_argument("--pre-batch", type=int, default=64)
    ap.add_argument("--pre-lr", type=float, default=2e-3, help="1e-3 x 100 steps: the sampled call was still "
                    "malformed or skipped in 28%% of episodes at temperature 1")
    ap.add_argument("--base", type=Path, default=BASE, help="built unless it exists")
    ap.add_argument("--tool-use", action="store_true",
                    help="the tool-use base instead (lookup_copy.peek_tooluse_base): it copies a tool's result when "
                    "it reads, and seldom reads (--direct-frac of its last pre-training episodes guess at once); "
                    "GRPO has to teach the call")
    ap.add_argument("--direct-frac", type=float, default=0.95, help="--tool-use: see above")
    ap.add_argument("--out", default="lookup_peek", help="results/<out>.json and docs/img/agent_<out>.png")
    ap.add_argument("--pretrain-only", action="store_true")
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--after", type=int, default=2, help="validation rounds logged past the target before stopping")
    ap.add_argument("--max-s", type=float, default=1200)
    ap.add_argument("--work", type=Path, default=ROOT / "runs/bench_peek")
    ap.add_argument("--tree", type=Path, default=None, help="run the fleet's code from this snapshot of the repo")
    ap.add_argument("overrides", nargs="*", help="config overrides for the fleet run (key=value)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    results, figure = RESULTS.with_name(f"{args.out}.json"), PLOT.with_name(f"agent_{args.out}.png")
    if args.tool_use:
        if args.base == BASE:
            args.base = BASE.with_name("tiny-qwen2-peek-tooluse")
        base = peek_tooluse_base(args.base, direct_frac=args.direct_frac)
    else:
        base = peek_base(args.base, args.pre_steps, args.pre_batch, args.pre_lr)
    result: dict[str, Any] = {"config": str(CONFIG.relative_to(ROOT)), "overrides": args.overrides,
                              "base": str(base.relative_to(ROOT)) if base.is_relative_to(ROOT) else str(base),
                              "pretrain": (base / "PRETRAIN.txt").read_text().strip(), "chance": 0.1,
                              "base_greedy": base_rates(base), "base_s": round(time.monotonic() - t0, 1)}
    print(json.dumps(result), flush=True)
    if args.pretrain_only:
        return
    args.work.mkdir(parents=True, exist_ok=True)
    result["load_at_start"] = os.getloadavg()
    result["run"] = run_fleet(args.work, [f"policy.model_name={base}", *args.overrides], args)
    result["load_at_end"] = os.getloadavg()
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, figure, "tool-use base: copies when it reads, seldom reads" if args.tool_use else
         "format base, random answers")
    va = result["run"]["val"]
    print(f"validation success {va[0]['success']:.2f} (step {va[0]['step']}) -> {va[-1]['success']:.2f} "
          f"(step {va[-1]['step']}) in {result['run']['wall_s']:.0f} s; wrote {results} and {figure}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["plot"]:  # re-plot the recorded result
        plot(json.loads(RESULTS.read_text()), PLOT)
    else:
        main()
