"""A skill acquired through the whole fleet, sync vs async (issue 21).

    python benchmarks/skill_demo.py pretrain                      # the base model (format only)
    python benchmarks/skill_demo.py run [--seeds 1,2,3] [--modes sync,async] [--steps 150]
    python benchmarks/skill_demo.py run --reuse                   # re-read finished runs, plot, write JSON
    python benchmarks/skill_demo.py variants --config examples/configs/arith_learn.yaml --steps 60 \
        --variants tis,icepop,seq-mask-tis,tis+fix --out arith_variants   # the IS variants where async collapsed
    python benchmarks/skill_demo.py collect --work DIR --out NAME   # all runs under DIR: one JSON, one figure
    python benchmarks/skill_demo.py compare [--seeds 1,2,3] [--steps 300]   # TRL's GRPOTrainer, async, sync (issue 35)
    python benchmarks/skill_demo.py compare --task arith --steps 120 --out arith_compare   # the same on the arith demo

Each run is a real `grpo-fleet up` of `examples/configs/digits_skill.yaml` (embedded Redis, replay buffer, sandbox,
one vLLM rollout worker, torchrun trainer; trainer on core 0, rollout fleet on core 1): the tiny Qwen2, pretrained
on the answer format with random answers (`workshop/pretrain.py`), learns "Largest digit of 3 1 4 1 2?" (`--task
digits`: "First digit of 4 7 1 9 2?") from a binary reward. The measure is the fleet's own validation
(`grpo.val_period`): greedy answers to 200 held-out lists. Sync and async runs of one seed use the same grpo.seed
(data order, sampling) and the same number of samples per step.

Per run (all from the trainer's metrics.jsonl, times from its first record = the first weights pushed): validation
accuracy and training reward per step, the step and the wall-clock second at which validation accuracy first
reaches 0.8, the final validation accuracy, and the off-policy diagnostics (`loss/token_mult_prob_error`, the
IS-ratio range). Results: benchmarks/results/skill_demo.json (+ docs/img/skill_demo.png, skill_offpolicy.png),
benchmarks/results/skill_variants.json (+ docs/img/skill_variants.png).
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
from benchmarks.core_usage import CoreSampler, load_samples, step_report  # noqa: E402
from trainer.metrics import read_jsonl  # noqa: E402 (after the path: the benchmark runs as a script)

CONFIG = ROOT / "examples/configs/digits_skill.yaml"
RESULTS = ROOT / "benchmarks/results"
TARGET = 0.8
# `compare --task arith`: the arith demo (examples/configs/arith_learn.yaml: tiny-qwen2 from random weights, a + b
# with a, b <= 2). Its config validates nothing (grpo.val_period: 0), so both systems get the same validation on the
# first 200 tasks of its validation split every 10 steps (ARITH_VAL), sampled at temperature 1: greedy answers of this
# recipe run to the 64-token cap as one digit repeated ("2222..."), whose first number is never right, so greedy
# accuracy stayed 0 through 80 steps of a fleet run. The reach criterion is ARITH_TARGET (docs/performance.md, "The
# same comparison on the arith demo", says why that level).
ARITH_CONFIG = ROOT / "examples/configs/arith_learn.yaml"
ARITH_VAL = ["grpo.val_period=10", "grpo.val_at_start=true", "grpo.max_val_samples=200", "grpo.val_temperature=1.0"]
ARITH_TARGET = 0.2
TARGETS = {"digits": TARGET, "digits_max": TARGET, "arith": ARITH_TARGET}
# A second reach criterion, read from the training batches rather than one validation round: the first step at which
# the mean training reward of the last REWARD_WINDOW steps (10 x 64 answers on arith) reaches the level. On arith the
# validation target sits on the plateau (0.15-0.25 sampled), where one noisy round decides the step; the training
# reward rises from ~0.25 to a ~0.58 plateau by step 30, so 0.45 is on the rise (docs/performance.md, arith).
REWARD_TARGETS = {"arith": 0.45}
REWARD_WINDOW = 10
SYNC = ["grpo.async_grpo.enabled=false", "grpo.async_grpo.in_flight_weight_updates=false"]
# A sync run's phases take turns (generate, then train), so each gets both cores; the config's pinning (trainer on
# core 0, rollout fleet on core 1) is for async, whose phases overlap. Issue 35, seed 1: 4.55 s per step pinned,
# 3.13 s this way (docs/performance.md, "Against the in-process peer").
SYNC_CORES = ["cluster.cpu_affinity={}", "policy.generation.vllm_cfg.cpu_threads=affinity"]
# The in-process peer (benchmarks/trl_peer.py) as a mode of `compare`: TRL as it is, and with its KL gradient made the
# fleet's (loss_fn.kl_score_function_gradient).
PEER_MODES = {"trl": [], "trl-scorekl": ["--bias-correction-kl"]}
# The fleet's modes; "-k3grad": the gradient of beta * k3 alone, as TRL takes it (issue 35).
K3GRAD = ["loss_fn.kl_score_function_gradient=false"]
# The layout for a tiny model on two cores (issue 35, arith): the in-process batched `hf` engine instead of vLLM (no
# EngineCore and worker processes to start, 2.5 s against 19 s, and no idle engine polling next to the trainer in
# sync), prompts shared across a group's answers in the trainer, and no pinning, so that each fleet takes the cores
# the other leaves free.
HF_LAYOUT = ["policy.generation.backend=hf", "policy.prefix_sharing=true", *SYNC_CORES]
FLEET_MODES = {"sync": [*SYNC, *SYNC_CORES], "async": [], "sync-pinned": SYNC, "async-unpinned": SYNC_CORES,
               "sync-k3grad": [*SYNC, *SYNC_CORES, *K3GRAD], "async-k3grad": K3GRAD,
               "sync-hf": [*SYNC, *HF_LAYOUT], "async-hf": HF_LAYOUT,
               "async-hf-age1": [*HF_LAYOUT, "grpo.async_grpo.max_trajectory_age_steps=1"]}
# The fix for the async collapse of the arith demo (docs/services/trainer.md): `variants tis+fix` adds these.
FIX = ["policy.optimizer.lr=3e-4", "grpo.async_grpo.max_trajectory_age_steps=1", "grpo.skip_update_without_signal=true"]
VARIANTS = {
    "tis": ["loss_fn.truncated_importance_sampling_type=tis"],
    "icepop": ["loss_fn.truncated_importance_sampling_type=icepop",
               "loss_fn.truncated_importance_sampling_ratio_min=0.5"],
    "seq-mask-tis": ["loss_fn.truncated_importance_sampling_type=seq-mask-tis",
                     "loss_fn.truncated_importance_sampling_ratio_min=0.5"],
}


def base_model(task: str) -> Path:
    return ROOT / f".cache/models/tiny-qwen2-{task}-format"


def pretrain(task: str) -> Path:
    """The base model of `task` (`digits`: first digit, `digits_max`: largest digit): the format only (chance:
    `envs.digits.chance`, 1/10 and 1/8). `arith`: the arith demo's own, `tiny-qwen2` with random weights (made on
    first use, in the cache the fleet reads)."""
    sys.path.insert(0, str(ROOT))
    if task == "arith":
        from workshop.resolve import resolve_model

        return Path(resolve_model("tiny-qwen2"))
    from envs.digits import format_corpus, max_format_corpus
    from workshop.pretrain import ensure_format_model

    corpus = {"digits": format_corpus, "digits_max": max_format_corpus}[task]
    return ensure_format_model(base_model(task), corpus, name=task)


def run_fleet(name: str, work: Path, steps: int, overrides: list[str], timeout_s: float, task: str | None,
              tree: Path | None = None, after: int = 2, config: Path = CONFIG,
              target: float = TARGET) -> dict[str, Any]:
    """One `grpo-fleet up` of `config` (`task` None: its own model and data). `tree`: run the fleet's code from that
    snapshot of the repository (e.g. `git archive HEAD` plus this benchmark's files) rather than from this checkout,
    so that edits in progress in a shared working tree cannot break a long benchmark; models stay in this
    checkout's cache."""
    rd = work / name
    if rd.exists():
        subprocess.run(["rm", "-rf", str(rd)], check=True)
    log_path = work / f"{name}.log"
    code = tree or ROOT
    env = {**os.environ, "PYTHONPATH": str(code), "GRPO_FLEET_CACHE": str(ROOT / ".cache")}
    if tree and not (tree / "grpofleet").is_dir():
        # The generated gRPC code is not in git: without its own, the snapshot would import this checkout's, which
        # may have been regenerated from someone's protos in progress.
        subprocess.run([sys.executable, "-m", "fleet.protogen"], cwd=tree, env=env, check=True)
    task_keys = [f"policy.model_name={base_model(task)}", f"data.train.dataset_name={task}"] if task else []
    cmd = [sys.executable, "-m", "launch.cli", "up", "--config", str(code / config.resolve().relative_to(ROOT)),
           f"run.dir={rd}", *task_keys, "logger.progress_bar=false", f"grpo.max_num_steps={steps}", *overrides]
    print(f"[{name}] {' '.join(cmd[3:])}  (log: {log_path})", flush=True)
    t0 = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
        stopped = _watch(proc, rd / "logs/metrics.jsonl", t0, timeout_s, after, target)
    if proc.returncode != 0 and not stopped:
        tail = log_path.read_text().splitlines()[-30:]
        raise RuntimeError(f"{name}: grpo-fleet up exited with {proc.returncode}; last lines:\n" + "\n".join(tail))
    out = summarize(name, rd, overrides, target)
    out["launcher_s"], out["stopped_early"] = time.monotonic() - t0, stopped
    print(f"[{name}] " + json.dumps({k: out[k] for k in ("reach_step", "reach_s", "final_val", "wall_s")}), flush=True)
    return out


def _watch(proc: subprocess.Popen[bytes], metrics: Path, t0: float, timeout_s: float, after: int,
           target: float = TARGET) -> str:
    """Wait for the fleet; stop it (SIGTERM: the trainer checkpoints and the fleet shuts down cleanly) once
    validation has reached the target and `after` more rounds have been logged, or when `timeout_s` has passed.
    Returns why it was stopped ("" if it ran to its last step)."""
    why = ""
    while proc.poll() is None:
        time.sleep(5)
        if why:
            continue
        accs = [r["val/accuracy"] for r in read_jsonl(metrics) if "val/accuracy" in r]
        hit = next((i for i, a in enumerate(accs) if a >= target), None)
        if hit is not None and len(accs) - 1 - hit >= after:
            why = "target reached"
        elif time.monotonic() - t0 > timeout_s:
            why = "timeout"
        if why:
            print(f"  stopping the fleet: {why}", flush=True)
            proc.terminate()
    proc.wait()
    return why


def reward_reach(train: list[dict[str, Any]], level: float, window: int = REWARD_WINDOW) -> dict[str, Any] | None:
    """The first training record (step, t) at which the mean reward of the last `window` consecutive steps (it
    included) is >= `level`; None if never. Steps are 1-based and must be consecutive within the window."""
    by_step = {t["step"]: t for t in train if t.get("reward") is not None}
    for step in sorted(by_step):
        rows = [by_step.get(s) for s in range(step - window + 1, step + 1)]
        if all(r is not None for r in rows) and statistics.mean(r["reward"] for r in rows if r) >= level:
            return by_step[step]
    return None


def summarize(name: str, rd: Path, overrides: list[str], target: float = TARGET) -> dict[str, Any]:
    records = read_jsonl(rd / "logs/metrics.jsonl")
    records = [r for r in records if "histogram" not in r]
    t0 = min(r["time"] for r in records)
    train = [{"step": r["step"] + 1, "t": r["time"] - t0, "reward": r["reward/mean"],
              "tmpe": r.get("loss/token_mult_prob_error"), "is_min": r.get("loss/is_ratio_min"),
              "is_max": r.get("loss/is_ratio_max"), "is_oob": r.get("loss/is_oob_ratio"),
              "zero_std": r.get("data/zero_std_groups_frac"), "age_max": r.get("age/max"),
              "step_s": r.get("timing/step_s"), "grad_norm": r.get("train/grad_norm"),
              "truncated": r.get("data/truncated_frac"), "response_len": r.get("data/response_len_mean"),
              "max_dlogp": r.get("loss/max_abs_logprob_diff"), "worst_pos": r.get("loss/worst_token_position")}
             for r in records if "reward/mean" in r]
    # val/step = the number of steps the validated weights have trained; 0 = the base model.
    val = [{"step": int(r["val/step"]), "t": r["time"] - t0, "acc": r["val/accuracy"],
            "round_s": r.get("timing/validation_s")} for r in records if "val/accuracy" in r]
    train.sort(key=lambda s: s["step"])
    val.sort(key=lambda v: v["step"])
    reach = next((v for v in val if v["acc"] >= target), None)
    return {"name": name, "overrides": overrides, "train": train, "val": val,
            "chance_val": val[0]["acc"] if val and val[0]["step"] == 0 else None,
            "reach_step": reach["step"] if reach else None, "reach_s": reach["t"] if reach else None,
            "final_val": val[-1]["acc"] if val else None, "wall_s": train[-1]["t"] if train else None,
            "steps": len(train), "step_s_median": statistics.median([s["step_s"] for s in train if s["step_s"]])}


def _plot(runs: list[dict[str, Any]], path: Path, title: str, offpolicy: bool = False, chance: float = 0.1,
          by_run: bool = False, target: float = TARGET, val_kind: str = "greedy") -> None:
    """`by_run`: a colour per run (collect's runs of one mode), else per mode; `chance`: the dotted line;
    `val_kind`: how validation answered (greedy, or sampled: arith's comparison)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"sync": "tab:blue", "async": "tab:orange", "trl": "tab:purple", "trl-scorekl": "tab:pink",
              "sync-pinned": "tab:gray", "sync-hf": "tab:blue", "async-hf": "tab:orange",
              "async-hf-age1": "tab:red",
              "sync-k3grad": "tab:cyan", "async-k3grad": "tab:brown", "tis": "tab:orange",
              "icepop": "tab:green", "seq-mask-tis": "tab:red", "tis+fix": "tab:blue"}
    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5))
    for i, run in enumerate(runs):
        mode = run["name"].rsplit("-s", 1)[0]
        color = f"C{i % 10}" if by_run else colors.get(mode, "gray")
        kw = {"color": color, "alpha": 0.85, "linewidth": 1.2}
        tr, va = run["train"], run["val"]
        if offpolicy:
            axes[0][0].plot([s["step"] for s in tr], [s["tmpe"] for s in tr], label=run["name"], **kw)
            axes[0][1].plot([s["step"] for s in tr], [s["is_max"] for s in tr], label=run["name"], **kw)
            axes[0][1].plot([s["step"] for s in tr], [s["is_min"] for s in tr], linestyle=":", **kw)
            axes[1][0].plot([v["step"] for v in va], [v["acc"] for v in va], label=run["name"], **kw)
            # Answers that ran to the cap: the end-of-turn token's fate (issue 21's collapse)
            axes[1][1].plot([s["step"] for s in tr], [s["truncated"] for s in tr], label=run["name"], **kw)
        else:
            for col, key in ((0, "step"), (1, "t")):
                axes[0][col].plot([v[key] for v in va], [v["acc"] for v in va], label=run["name"], **kw)
                axes[1][col].plot([s[key] for s in tr], [s["reward"] for s in tr], label=run["name"], **kw)
    if offpolicy:
        labels = (("step", "loss/token_mult_prob_error"), ("step", "IS ratio max (solid) / min (dotted)"),
                  ("step", f"validation accuracy ({val_kind}, held out)"),
                  ("step", "answers cut at max_new_tokens (data/truncated_frac)"))
        axes[0][1].set_yscale("log")
    else:
        labels = (("training step", f"validation accuracy ({val_kind}, held out)"),
                  ("wall-clock s (from the first weights pushed)", f"validation accuracy ({val_kind}, held out)"),
                  ("training step", "training reward"), ("wall-clock s", "training reward"))
    for ax, (xl, yl) in zip([a for row in axes for a in row], labels, strict=True):
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        if "accuracy" in yl:
            ax.axhline(target, color="black", linewidth=0.6, linestyle="--")
            ax.axhline(chance, color="gray", linewidth=0.6, linestyle=":")
    axes[0][0].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"plot: {path}")


def _spread(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    xs = [r[key] for r in runs]
    ok = [x for x in xs if x is not None]
    return {"values": xs, "min": min(ok) if ok else None, "max": max(ok) if ok else None,
            "median": statistics.median(ok) if ok else None}


def run_peer(name: str, work: Path, steps: int, seed: int, timeout_s: float, after: int,
             overrides: list[str], extra: list[str], target: float = TARGET) -> dict[str, Any]:
    """One run of the in-process peer (benchmarks/trl_peer.py: TRL's GRPOTrainer on this demo's recipe), stopped
    like a fleet run: `after` validation rounds past the target, or at `timeout_s`."""
    log_path = work / f"{name}.log"
    cmd = [sys.executable, str(ROOT / "benchmarks/trl_peer.py"), "--seed", str(seed), "--steps", str(steps),
           "--work", str(work), "--name", name, "--after", str(after), "--target", str(target),
           *extra, *[f"--set={o}" for o in overrides]]
    print(f"[{name}] {' '.join(cmd[2:])}  (log: {log_path})", flush=True)
    t0 = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout_s)
            stopped = ""
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stopped = "timeout"
    if proc.returncode != 0 and not stopped:
        tail = log_path.read_text().splitlines()[-30:]
        raise RuntimeError(f"{name}: trl_peer.py exited with {proc.returncode}; last lines:\n" + "\n".join(tail))
    out = summarize(name, work / name, overrides, target)
    out["launcher_s"], out["stopped_early"] = time.monotonic() - t0, stopped
    print(f"[{name}] " + json.dumps({k: out[k] for k in ("reach_step", "reach_s", "final_val", "wall_s")}), flush=True)
    return out


def run(args: argparse.Namespace) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    unknown = [m for m in args.modes.split(",") if m not in FLEET_MODES and m not in PEER_MODES]
    if unknown:
        raise SystemExit(f"--modes: unknown {unknown}; known: {', '.join([*FLEET_MODES, *PEER_MODES])}")
    pretrain(args.task)
    target = args.target if args.target is not None else TARGETS[args.task]
    arith = args.task == "arith"
    # arith: its own config and model (no task keys), validation for both systems, and the peer on that recipe.
    config, fleet_task = (ARITH_CONFIG, None) if arith else (CONFIG, args.task)
    common = [*(ARITH_VAL if arith else []), *args.set]
    peer_task = ["--task", "arith"] if arith else []
    runs: list[dict[str, Any]] = []
    # Each core's idle share per step (issue 35), kept in WORK/cores.jsonl so --reuse can report it too.
    sampler = CoreSampler(path=work / "cores.jsonl")
    if not args.reuse:
        sampler.start()
    for seed in [int(s) for s in args.seeds.split(",")]:
        for mode in args.modes.split(","):
            name = f"{mode}-s{seed}"
            overrides = [f"grpo.seed={seed}", *FLEET_MODES.get(mode, []), *common]
            if args.reuse:
                if (work / name / "logs/metrics.jsonl").is_file():  # runs not made are left out, not guessed
                    runs.append(summarize(name, work / name, overrides, target))
            elif mode in PEER_MODES:
                runs.append(run_peer(name, work, args.steps, seed, args.timeout, args.after, common,
                                     [*PEER_MODES[mode], *peer_task], target))
            else:
                runs.append(run_fleet(name, work, args.steps, overrides, args.timeout, fleet_task, args.tree,
                                      after=args.after, config=config, target=target))
    if sampler.is_alive():
        sampler.stop()
    level = args.reward_target if args.reward_target is not None else REWARD_TARGETS.get(args.task)
    for r in runs:
        hit = reward_reach(r["train"], level) if level is not None else None
        r.update(reward_target=level, reward_reach_step=hit["step"] if hit else None,
                 reward_reach_s=hit["t"] if hit else None)
    samples = sampler.samples or (load_samples(work / "cores.jsonl") if (work / "cores.jsonl").is_file() else [])
    for r in runs:
        r["cores"] = step_report(samples, work / r["name"] / "logs/metrics.jsonl") if samples else {}
    by_mode = {m: [r for r in runs if r["name"].rsplit("-s", 1)[0] == m] for m in args.modes.split(",")}
    result = {"env": env_info(), "config": str(config.relative_to(ROOT)), "steps": args.steps, "target": target,
              "summary": {m: {k: _spread(rs, k) for k in ("reach_step", "reach_s", "reward_reach_step",
                                                         "reward_reach_s", "final_val", "chance_val",
                                                         "step_s_median")} for m, rs in by_mode.items()},
              "runs": runs}
    out = args.out if args.what == "compare" else "skill_demo"
    (RESULTS / f"{out}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    level = _chance(args.task)
    who = "TRL's GRPOTrainer (one process) and the fleet" if "trl" in by_mode else "the fleet"
    if arith:
        title = (f"a + b (a, b <= 2): tiny Qwen2 from random weights, target {target} (dotted: the best constant "
                 f"answer, {level:.2g}),\n{who}, 2 CPU cores")
    else:
        what = {"digits": "first digit", "digits_max": "largest digit"}[args.task]
        title = (f"{what} of a 5-digit list: tiny Qwen2 (format-pretrained, chance {level:.3g}), {who}, 2 CPU "
                 "cores")
    _plot(runs, ROOT / f"docs/img/{out}.png", title, chance=level, target=target,
          val_kind="sampled at T=1" if arith else "greedy")
    if args.what == "run":
        _plot(runs, ROOT / "docs/img/skill_offpolicy.png", "off-policy diagnostics (sync runs: no staleness, so "
              "the error is 1 and the ratios 1)", offpolicy=True, chance=level)


def variants(args: argparse.Namespace) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    config = Path(args.config).resolve()
    task = args.task if config == CONFIG else None  # another config brings its own model and data
    if task:
        pretrain(task)
    runs = []
    for v in args.variants.split(","):
        kind, _, recipe = v.partition("+")
        overrides = [f"grpo.seed={args.seed}", *VARIANTS[kind], *(FIX if recipe == "fix" else []), *args.set]
        name = f"{v}-s{args.seed}"
        runs.append(summarize(name, work / name, overrides) if args.reuse
                    else run_fleet(name, work, args.steps, overrides, args.timeout, task, args.tree, config=config))
    out = RESULTS / f"{args.out}.json"
    out.write_text(json.dumps({"env": env_info(), "config": str(config.relative_to(ROOT)), "steps": args.steps,
                               "runs": runs}, indent=1) + "\n")
    _plot(runs, ROOT / f"docs/img/{args.out}.png", f"async, seed {args.seed}: IS correction variants "
          f"({config.name}, {args.steps} steps)", offpolicy=True)


def collect(args: argparse.Namespace) -> None:
    """Every finished run under --work (variants of several seeds) into results/<out>.json and one figure."""
    work = Path(args.work)
    runs = [summarize(rd.name, rd, []) for rd in sorted(work.iterdir()) if (rd / "logs/metrics.jsonl").is_file()]
    for r in runs:
        tr = [x for x in r["train"] if x["tmpe"] is not None]
        r["max_token_mult_prob_error"] = max(x["tmpe"] for x in tr)
        r["is_ratio_range"] = [min(x["is_min"] for x in tr), max(x["is_max"] for x in tr)]
        r["min_reward_after_10"] = min(x["reward"] for x in tr[10:]) if len(tr) > 10 else None
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"env": env_info(), "work": str(work), "runs": runs},
                                                         indent=1) + "\n")
    _plot(runs, ROOT / f"docs/img/{args.out}.png", args.title or "async arith demo: IS correction variants and the "
          "fix, by seed", offpolicy=True, by_run=True, chance=_chance(args.task))
    for r in runs:
        print(r["name"], "max tmpe", round(r["max_token_mult_prob_error"], 2), "IS range",
              [round(x, 3) for x in r["is_ratio_range"]], "min reward after step 10", r["min_reward_after_10"])


def _chance(task: str) -> float:
    """Chance on `task`'s validation. arith (ops ["+"]): the best constant answer, the commonest sum of two operands
    drawn uniformly from 0..max_operand (1/3 for 2)."""
    sys.path.insert(0, str(ROOT))
    if task == "arith":
        from collections import Counter

        from fleet.config.loader import load_config

        n = load_config(ARITH_CONFIG, []).env.arith.max_operand + 1
        sums = Counter(a + b for a in range(n) for b in range(n))
        return max(sums.values()) / n**2
    from envs.digits import chance

    return chance({"digits": "first", "digits_max": "max"}[task])


def rewards(args: argparse.Namespace) -> None:
    """The training reward of each run of results/<out>.json in blocks of --block steps, per seed and averaged over
    seeds by system: whether one system learns more per step than another, read from every step's samples (the
    training batch) rather than from when one validation round of 200 answers first crosses the target."""
    result = json.loads((RESULTS / f"{args.out}.json").read_text())
    width = args.block
    table: dict[str, dict[int, list[float]]] = {}
    for r in result["runs"]:
        system = r["name"].rsplit("-s", 1)[0]
        rows = [t for t in r["train"] if t.get("reward") is not None]
        for start in range(1, args.steps + 1, width):
            block = [t["reward"] for t in rows if start <= t["step"] < start + width]
            if len(block) == width:  # a run stopped early leaves its last block out, not half-counted
                table.setdefault(system, {}).setdefault(start, []).append(statistics.mean(block))
    print(f"mean training reward per {width}-step block (one value per seed, then their mean)")
    for system, blocks in table.items():
        cells = [f"{s}-{s + width - 1}: " + " ".join(f"{x:.3f}" for x in xs) + f" (mean {statistics.mean(xs):.3f})"
                 for s, xs in sorted(blocks.items())]
        print(f"{system:>8}  " + "; ".join(cells))


def env_info() -> dict[str, Any]:
    import platform

    return {"machine": platform.machine(), "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "loadavg_1m": os.getloadavg()[0]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["pretrain", "run", "compare", "variants", "collect", "rewards"])
    p.add_argument("--task", default="digits_max", choices=["digits_max", "digits", "arith"],
                   help="arith: compare only (the arith demo's config, model, validation and target)")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--modes", default=None, help="run: sync,async (default); compare: trl,async,sync (default)")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--variants", default="tis,icepop,seq-mask-tis")
    p.add_argument("--seed", type=int, default=1, help="variants: the grpo.seed of every variant run")
    p.add_argument("--config", default=str(CONFIG), help="variants: the config (another one brings its own model)")
    p.add_argument("--out", default=None,
                   help="variants, compare: results/<out>.json and docs/img/<out>.png (skill_variants, skill_compare)")
    p.add_argument("--work", default="/tmp/grpo-fleet-skill-demo", help="run directories and logs")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds after which a run is stopped (the demo's target is 0.8 within 15 minutes)")
    p.add_argument("--after", type=int, default=2,
                   help="validation rounds a run goes on after first reaching 0.8 (a large number: all --steps)")
    p.add_argument("--set", nargs="*", default=[], help="extra config overrides (key=value) for every run")
    p.add_argument("--tree", type=Path, default=None, help="run the fleet from this snapshot of the code")
    p.add_argument("--reuse", action="store_true", help="summarize the runs already in --work, run nothing")
    p.add_argument("--title", default="", help="collect: the figure's title")
    p.add_argument("--block", type=int, default=10, help="rewards: steps per block")
    p.add_argument("--target", type=float, default=None, help="compare: validation accuracy to reach (default: "
                   "the task's, " + ", ".join(f"{k} {v}" for k, v in TARGETS.items()) + ")")
    p.add_argument("--reward-target", type=float, default=None,
                   help=f"compare: the {REWARD_WINDOW}-step mean training reward to reach (default: the task's, "
                   + ", ".join(f"{k} {v}" for k, v in REWARD_TARGETS.items()) + "; other tasks none)")
    args = p.parse_args()
    args.modes = args.modes or ("trl,async,sync" if args.what == "compare" else "sync,async")
    args.out = args.out or ("skill_compare" if args.what in ("compare", "rewards") else "skill_variants")
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.what == "pretrain":
        print(pretrain(args.task))
    else:
        {"run": run, "compare": run, "variants": variants, "collect": collect, "rewards": rewards}[args.what](args)


if __name__ == "__main__":
    main()
