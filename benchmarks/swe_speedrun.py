"""SWE learning from nothing (issue 33): a code model made here, SFT on generated fixes, then GRPO through the fleet.

    python benchmarks/swe_speedrun.py prepare            # CPU, here: corpus, tokenizer, the task recipe's sdists
    python benchmarks/swe_speedrun.py fixes [--sft-tasks DIR]  # CPU, here: SFT examples from the corpus (and tasks)
    python benchmarks/swe_speedrun.py pretrain --out DIR # GPU: a Qwen2 from random weights, pre-trained
    python benchmarks/swe_speedrun.py sft-examples --out DIR   # SFT examples from part of the training functions
    python benchmarks/swe_speedrun.py sft --out DIR      # GPU: SFT of DIR/models/base on them
    python benchmarks/swe_speedrun.py grpo --mode both --model DIR/sft --out DIR   # GPU: GRPO, sync and async
    python benchmarks/swe_speedrun.py diagnose --report DIR/grpo_sync.json   # why the held-out answers fail
    python benchmarks/swe_speedrun.py smoke --out DIR    # every stage at toy size on CPU (the wiring; CI runs it)

On the lent H200 the GPU stages run in consecutive calls while the machine stays warm (`speedrun.sh`). Stages:

1. corpus (`speedrun/corpus.py`): Python source of ~240 PyPI sdists fetched with pip, none of them a task
   repository, deduplicated; a 16k byte-level BPE trained on it.
2. pretrain (`speedrun/lm.py`): the Qwen2 "100M" shape trained on the corpus with the trainer's own code (bf16
   autocast over fp32 masters, compiled decoder layers, the fused chunked log-prob loss, fused AdamW); loss and
   bits per byte on held-out files.
3. SFT (`speedrun/fixes.py`, `speedrun/lm.py`): the single-shot SWE prompt of each task of the SFT task set
   (`speedrun/sft.yaml`: the builder's mutations in repositories outside the evaluation) -> its fixing diff.
4. GRPO (`gpu_fleet_swe.py`): the whole fleet (embedded Redis, replay buffer, bubblewrap sandbox, batched `hf`
   engine, torchrun trainer) on the training repositories of `speedrun/tasks.yaml`; greedy validation on its
   held-out repositories before the first step and every `--val-period` steps.

Every stage writes its figures to a JSON file in `--out`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, get_args

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import corpus  # noqa: E402
import fixes  # noqa: E402
import lm  # noqa: E402
import regrade  # noqa: E402
from prompting import MAX_NEW, Prompting  # noqa: E402
from report import REMOVAL_KINDS, diagnose_rounds, finish_report, load_report  # noqa: E402

from fleet.contracts.sandbox import RewardMode  # noqa: E402

log = logging.getLogger("speedrun")

DATA = ROOT / ".speedrun"  # what `prepare` makes and the GPU stages read (git ignores it; it travels with carry)
SPEEDRUN = ROOT / "benchmarks" / "speedrun"
# The prompt's budget and code context, the same in every stage and process of a pipeline (SPEEDRUN_MAX_PROMPT,
# SPEEDRUN_CONTEXT_FUNCTIONS: speedrun/prompting.py); + MAX_NEW = the pre-training row length.
PROMPT = Prompting.from_env()


def write(out: Path, name: str, figures: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(figures, indent=1) + "\n")
    log.info("wrote %s", out / name)


def split_for_sft(tasks: Path, share: float) -> dict[str, int]:
    """Move `share` of the training tasks, whole functions at a time, from `train.jsonl` to `sft.jsonl`: SFT
    examples from the training repositories whose bugs GRPO then never sees (the held-out repositories stay out of
    both). Used when the SFT task set (`sft.yaml`) is not built."""
    from envs.swe.taskset import read_split, write_jsonl
    from launch.data.validate import function_split

    train = read_split(tasks, "train")
    sft = [t for t in train if function_split(t.repo, f"{t.metadata.get('file')}:{t.metadata.get('function')}",
                                              share) == "validation"]
    ids = {t.instance_id for t in sft}
    write_jsonl(tasks / "sft.jsonl", sft)
    write_jsonl(tasks / "train.jsonl", [t for t in train if t.instance_id not in ids])
    return {"sft": len(sft), "grpo_train": len(train) - len(sft)}


def carry_sdists(recipe: Path, cache: Path, dest: Path) -> list[str]:
    """The recipe's pinned sdists (repositories and vendored dependencies) in `dest`, so that the task set can be
    built where pip cannot download (the lent GPU machine): `grpo-fleet data build --cache-dir dest`."""
    from launch.data.recipe import load_recipe
    from launch.data.sdist import fetch_sdist

    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for repo in load_recipe(recipe).repos:
        for package, version, sha in [(repo.package, repo.version, repo.sha256),
                                      *((v.package, v.version, v.sha256) for v in repo.vendor)]:
            path = fetch_sdist(package, version, sha, cache)
            shutil.copy(path, dest / path.name)
            names.append(path.name)
    return names


# The GRPO task repositories (training and held out) are kept out of the corpus; the SFT repositories are not
# evaluated on, and their code in the corpus is no leak.
CORPUS_RECIPES = [ROOT / "launch/data/recipe.yaml", SPEEDRUN / "tasks.yaml"]


def prepare(args: argparse.Namespace) -> None:
    """CPU, where pip reaches an index: the corpus and its tokenizer, and the task recipe's sdists."""
    t0 = time.perf_counter()
    figures: dict[str, Any] = {"corpus": corpus.run(DATA / "corpus", args.cache / "corpus-sdists", CORPUS_RECIPES,
                                                    locked=args.locked)}
    # Both recipes' sdists travel: the GPU host's CPUs can build either set while its GPU pre-trains.
    figures["sdists"] = [name for recipe in ("tasks.yaml", "sft.yaml")
                         for name in carry_sdists(SPEEDRUN / recipe, args.cache / "sdists", DATA / "sdists")]
    figures["seconds"] = time.perf_counter() - t0
    figures["carry_bytes"] = sum(f.stat().st_size for f in DATA.rglob("*") if f.is_file() and "results" not in f.parts)
    write(args.out, "prepare.json", figures)


def fixes_stage(args: argparse.Namespace) -> None:
    """CPU, here: SFT examples that need no GPU and travel small: `--corpus-fixes N` mutations of the corpus's own
    functions, and the tasks of a built SFT task set (`--sft-tasks DIR`, from `speedrun/sft.yaml`)."""
    t0 = time.perf_counter()
    tokenizer = args.data / "corpus" / "tokenizer"
    figures: dict[str, Any] = {}
    if args.corpus_fixes:
        figures["corpus"] = fixes.corpus_examples(args.data / "corpus" / "train.jsonl.xz", tokenizer,
                                                  args.data / "fixes" / "corpus.jsonl.xz", n=args.corpus_fixes,
                                                  prompting=PROMPT, workers=args.workers,
                                                  context_lines=args.diff_context, per_file=args.per_file,
                                                  rename_share=args.rename_share)
    if args.sft_tasks:
        figures["sft_tasks"] = fixes.build(args.sft_tasks, tokenizer, args.data / "fixes" / f"{args.name}.jsonl.xz",
                                           prompting=PROMPT, context_lines=args.diff_context)
    figures["seconds"] = time.perf_counter() - t0
    write(args.out, "fixes.json", figures)


def tokenizer_stage(args: argparse.Namespace) -> None:
    """CPU: the tokenizer of a corpus `prepare` made, trained again (after a change to its split; ~1 min here); the
    old one is kept as `DATA/tokenizer.previous`. The corpus fixes and SFT-task pairs made with the old one must be
    made again: their prompts' budgets were counted in its tokens."""
    out = args.data / "corpus" / "tokenizer"
    if out.is_dir():  # the earlier runs' answers are its token ids (`report.check_tokenizer`); outside the corpus
        # folder, which `stash` carries at its limit
        shutil.rmtree(args.data / "tokenizer.previous", ignore_errors=True)
        out.rename(args.data / "tokenizer.previous")
    t0 = time.perf_counter()
    corpus.train_tokenizer(args.data / "corpus", out)
    figures = {"seconds": round(time.perf_counter() - t0, 1),
               "heldout_bytes_per_token": round(corpus.bytes_per_token(out, args.data / "corpus"), 3)}
    log.info("%s", json.dumps(figures))
    write(args.out, "tokenizer.json", figures)


def corpus_more_stage(args: argparse.Namespace) -> None:
    """CPU, where `prepare` ran: the training files the corpus's 150 MB cap left out (312 MB of the 462), in parts of
    ~16 MB as xz (`corpus.build_more`; four, 50 MB, that travel in one device call of their own); pre-training reads
    every part beside the corpus. The seventeenth run's 240 s of pre-training went 3.2 times over its 38M-token
    sample; the whole corpus is ~3 times that. The tokenizer and the held-out files do not change."""
    t0 = time.perf_counter()
    _, sdists, excluded = corpus.sources(args.cache / "corpus-sdists", CORPUS_RECIPES, locked=True)
    figures = corpus.build_more(sdists, args.data / "corpus", excluded, part_bytes=int(args.part_mb * 1e6),
                                max_parts=args.max_parts)
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    log.info("%s", json.dumps(figures))
    write(args.out, "corpus_more.json", figures)


def localisation_stage(args: argparse.Namespace) -> None:
    """CPU: how often the held-out prompts show the buggy function and the fix's lines (`fixes.localisation`)."""
    figures = fixes.localisation(args.data / "tasks", args.data / "corpus" / "tokenizer",
                                 prompting=PROMPT)
    log.info("%s", json.dumps(figures))
    write(args.out, f"localisation_{args.name}.json", figures)


def _device(args: argparse.Namespace) -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"


def pretrain(args: argparse.Namespace) -> None:
    import torch

    device = _device(args)
    shape = lm.SMOKE_SHAPE if args.cpu else lm.SHAPE
    models = args.out / "models"
    rows = args.rows_per_step or lm.rows_per_step(PROMPT.row_tokens, 64)
    init = lm.make_model(args.data / "corpus" / "tokenizer", models / "init", shape,
                         max_positions=PROMPT.row_tokens)
    pre = lm.pretrain(init, args.data / "corpus", out=models / "base", seq_len=PROMPT.row_tokens,
                      rows_per_step=rows, steps=args.pretrain_steps, peak_lr=args.pretrain_lr,
                      max_seconds=args.pretrain_seconds, device=device, compile=not args.cpu,
                      max_eval_rows=args.eval_rows)
    write(args.out, "pretrain.json", {**pre, "shape": shape, "device": device, "prompting": PROMPT.figures(),
                                      "rows_per_step": rows,
                                      "gpu": torch.cuda.get_device_name() if device == "cuda" else None})


def sft_examples(args: argparse.Namespace) -> None:
    """SFT examples from a built task set: `--sft-from-train SHARE` of its training functions (`split_for_sft`)."""
    from envs.swe.taskset import summarize

    summary = summarize(args.data / "tasks")
    figures: dict[str, Any] = {"tasks": {k: summary[k] for k in ("per_split", "per_repo", "per_kind", "functions",
                                                                   "total")}}
    figures["sft_split"] = split_for_sft(args.data / "tasks", args.sft_from_train)
    figures["sft_examples"] = fixes.build(args.data / "tasks", args.data / "corpus" / "tokenizer",
                                          args.data / "sft.jsonl.xz", prompting=PROMPT, splits=("sft",),
                                          context_lines=args.diff_context)
    write(args.out, "sft_examples.json", figures)


def sft(args: argparse.Namespace) -> None:
    models = args.out / "models"
    # Task examples (statements written from failing tests, as GRPO's) count `--task-weight` times against the
    # corpus's (statements that name the function).
    # SFT task sets built here and there (`fixes --sft-tasks DIR --name sft_tasks*`) overlap: the builder picks the
    # same bugs first whatever --max-per-repo, so each task counts once.
    PROMPT.check_model(models / "base")
    pairs = {path: fixes.read(path) for path in [args.data / "sft.jsonl.xz",
                                                 *sorted((args.data / "fixes").glob("sft_tasks*.jsonl.xz")),
                                                 args.data / "fixes" / "corpus.jsonl.xz"] if path.exists()}
    for path, rows in pairs.items():
        PROMPT.check_pairs(rows, path)
    by_id = {e["instance_id"]: e for path, rows in pairs.items() if path.name != "corpus.jsonl.xz" for e in rows}
    tasks = list(by_id.values())
    from_corpus = pairs.get(args.data / "fixes" / "corpus.jsonl.xz", [])
    examples = [*tasks * args.task_weight, *from_corpus]
    random.Random(0).shuffle(examples)
    examples = examples[: args.sft_examples]
    log.info("SFT on %d task examples (x%d) and %d corpus examples", len(tasks), args.task_weight, len(from_corpus))
    batch = args.sft_batch or lm.rows_per_step(PROMPT.row_tokens, 32)
    tuned = lm.sft(models / "base", examples, out=models / "sft", epochs=args.sft_epochs, batch=batch,
                   peak_lr=args.sft_lr, max_seconds=args.sft_seconds, device=_device(args), compile=not args.cpu,
                   row_tokens=PROMPT.row_tokens, max_completion_tokens=MAX_NEW)
    spelt = fixes.paths_spelt_alike(models / "sft", args.data / "tasks")
    log.info("the SFT model's tokenizer spells %d of %d gold-patch paths alike in the code header and the diff",
             spelt["alike"], spelt["paths"])
    write(args.out, "sft.json", {**tuned, "task_examples": len(tasks), "task_weight": args.task_weight,
                                 "corpus_examples": len(from_corpus), "paths_spelt_alike": spelt, "batch": batch,
                                 "prompting": PROMPT.figures()})


def parse_kinds(spec: str) -> frozenset[str]:
    """`--train-kinds`: `in-place` (every kind but REMOVAL_KINDS) or a comma-separated list of the builder's kinds.
    No held-out answer of runs 3-5 resolved a removal bug (76 resolves, all of kinds that edit a line in place), so
    their groups hold no resolve to learn from."""
    from launch.data.mutations import BUG_KINDS

    if spec == "in-place":
        return frozenset(BUG_KINDS) - REMOVAL_KINDS
    kinds = frozenset(k for k in spec.split(",") if k)
    unknown = sorted(kinds - set(BUG_KINDS))
    if unknown or not kinds:
        raise SystemExit(f"--train-kinds: unknown bug kind(s) {unknown or spec!r}; known: in-place, "
                         f"{', '.join(BUG_KINDS)}")
    return kinds


def library_frames(statement: str, test_files: list[str]) -> bool:
    """Whether the statement's traceback passes through the library (a frame in a file that is not a test file):
    then the line that raised is in the statement, and the buggy function is often one of those frames. Read off
    the statement alone, as the retrieval reads it (`envs.swe.retrieval.traceback_lines`), never off the gold
    patch."""
    from envs.swe.retrieval import is_test_path, traceback_lines

    def is_test(path: str) -> bool:  # the retrieval's test paths, and the files the task names as its tests
        return is_test_path(path) or any(path == t or path.endswith(f"/{t}") or t.endswith(f"/{path}")
                                         for t in test_files)

    return any(not is_test(path) for path, _ in traceback_lines(statement))


def train_split(tasks: Path, kinds: frozenset[str] | None, frames: bool, name: str = "train_kinds",
                shown: Path | None = None) -> tuple[str, int]:
    """Write the training tasks of `kinds` (None: every kind) whose statement shows a library frame (`frames`) and,
    given the tokenizer folder `shown`, whose prompt shows the lines their fix changes (`fixes.fixes_shown`) as
    split `name` of the task set (`data.train.split=name`); the validation split is left whole, so the evaluation
    does not change."""
    from envs.swe.taskset import read_split, write_jsonl

    chosen = [t for t in read_split(tasks, "train")
              if (kinds is None or t.metadata.get("bug_kind") in kinds)
              and (not frames or library_frames(t.problem_statement, list(t.metadata.get("test_files") or [])))]
    if shown is not None and chosen:
        visible = fixes.fixes_shown(tasks, shown, chosen, prompting=PROMPT)
        chosen = [t for t, v in zip(chosen, visible, strict=True) if v]
    if not chosen:
        raise SystemExit(f"--train-kinds/--train-frames/--train-shown: no training task of {tasks} has a kind in "
                         f"{sorted(kinds or ['any'])}{' and a library frame' if frames else ''}"
                         f"{' and its fix in the prompt' if shown else ''}")
    write_jsonl(tasks / f"{name}.jsonl", chosen)
    return name, len(chosen)


def grpo(args: argparse.Namespace) -> None:
    """GRPO through the whole fleet (benchmarks/gpu_fleet_swe.py) with greedy validation on held-out repos.

    `--mode both` runs a sync and an async fleet side by side on the one GPU, each with half the sandbox's runners:
    one device call instead of two, and the two modes share the same machine at the same time (the model is small;
    the sandbox, not the GPU, bounds the step)."""
    modes = ["sync", "async"] if args.mode == "both" else [args.mode]
    if args.model is None:
        raise SystemExit("grpo: --model (the SFT model's folder) is required")
    PROMPT.check_model(args.model)
    if args.train_kinds or args.train_frames or args.train_shown:
        kinds = parse_kinds(args.train_kinds) if args.train_kinds else None
        split, n = train_split(args.data / "tasks", kinds, args.train_frames,
                               shown=args.data / "corpus" / "tokenizer" if args.train_shown else None)
        log.info("GRPO trains on the %d training tasks of kinds %s%s%s", n, args.train_kinds or "(all)",
                 " whose statement shows a library frame" if args.train_frames else "",
                 " whose prompt shows the lines their fix changes" if args.train_shown else "")
        args.overrides = [f"data.train.split={split}", *args.overrides]
    pool = args.pool or max(2, ((os.cpu_count() or 2) - 4) // len(modes))
    runs: dict[str, subprocess.Popen[bytes]] = {}
    for mode in modes:
        cmd = fleet_command(args, mode, pool)
        log.info("%s", " ".join(cmd))
        # Side by side, each fleet writes its own log (interleaved lines would be unreadable).
        stdout = (args.out / f"grpo_{mode}.log").open("wb") if len(modes) > 1 else None
        runs[mode] = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=subprocess.STDOUT if stdout else None)
        if stdout is not None:
            stdout.close()  # the child holds its own copy
    failed = []
    for mode, proc in runs.items():
        rc = proc.wait()
        path = args.out / f"grpo_{mode}.json"
        if path.is_file():  # a fleet that ran out of time still reports the rounds it finished
            finish_report(path, args.data, PROMPT, diagnosis=args.diagnose)
        if rc:
            failed.append(f"{mode} exited {rc}")
    if failed:
        raise SystemExit(f"gpu_fleet_swe.py: {', '.join(failed)}")


def fleet_command(args: argparse.Namespace, mode: str, pool: int) -> list[str]:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_fleet_swe.py"), "--mode", mode, "--model",
           str(args.model), "--tasks", str(args.data / "tasks"), "--steps", str(args.steps), "--prompts",
           str(args.prompts), "--generations", str(args.generations), "--max-new-tokens", str(MAX_NEW),
           "--timeout", str(args.timeout), "--pool", str(pool), "--out", str(args.out / f"grpo_{mode}.json"),
           # A fixed run folder and a checkpoint at the end: a later `grpo --resume` call continues the run.
           "--run-dir", str((args.run_root or args.out / "runs") / mode), "--checkpoint"]
    if args.resume:
        cmd.append("--resume")
    if args.cpu:
        cmd.append("--cpu")
    return [*cmd, *PROMPT.overrides(), "grpo.val_at_start=true",
            f"grpo.val_period={args.val_period}", f"grpo.max_val_samples={args.val_tasks}",
            f"policy.optimizer.lr={args.lr}", f"env.code.reward_mode={args.reward_mode}",
            f"env.code.format_error_reward={args.format_error_reward}",
            # The failing tests alone first: most answers fail them, and the reward does not need the rest.
            f"env.code.fail_to_pass_first={str(args.reward_mode != 'pass_rate').lower()}",
            f"logger.val_answers_logged={args.val_tasks}",
            # Most steps hold no group whose rewards differ (two in three in the sixth run): their gradient is 0,
            # but AdamW would still step on momentum and weight decay (docs/swe-learning.md, "Sixth run").
            "grpo.skip_update_without_signal=true",
            f"env.code.task_timeout={args.task_timeout}",
            *([f"grpo.max_train_s={args.max_train_s}"] if args.max_train_s else []), *args.overrides]


def diagnose_stage(args: argparse.Namespace) -> None:
    """Diagnose the logged held-out answers of a GRPO report (`--report`), here or where it ran."""
    if args.finish:
        finish_report(args.report, args.data, PROMPT)
        return
    report = load_report(args.report)
    write(args.out, args.report.name.replace("grpo_", "diagnosis_"),
          {"report": str(args.report), "diagnosis": diagnose_rounds(report["validation_tasks"], args.data, PROMPT,
                                                                    report.get("tokenizer_sha256"))})


def regrade_stage(args: argparse.Namespace) -> None:
    """CPU: a report's held-out answers that did not apply, graded again by this tree's sandbox (`regrade.py`)."""
    figures = regrade.regrade(args.report, args.data, workers=args.workers)
    for before, now in zip(figures["heldout_logged"], figures["heldout_now"], strict=True):
        log.info("step %s: %d resolved as logged, %d as graded now (change %+.1f points, 95%% interval [%+.1f, %+.1f])",
                 now["step"], before["resolved"], now["resolved"], 100 * now["change"],
                 100 * now["change_ci95"][0], 100 * now["change_ci95"][1])
    write(args.report.parent, args.report.name.replace(".json", ".regraded.json"), figures)


def smoke(args: argparse.Namespace) -> None:
    """Every stage at toy size on CPU: a stdlib corpus, the embedded task set for both SFT and GRPO."""
    import sysconfig

    data = args.out / "data"
    (data / "corpus").mkdir(parents=True, exist_ok=True)
    import lzma

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))[:60]
    # A `corpus-more` part beside the sample, as a corpus past its cap has: pre-training reads both.
    for name, chosen in (("train", files[:40]), ("train-more-000", files[40:50]), ("heldout", files[50:])):
        with lzma.open(data / "corpus" / f"{name}.jsonl.xz", "wt") as f:
            for p in chosen:
                f.write(json.dumps({"package": "stdlib", "path": p.name, "text": p.read_text()}) + "\n")
    corpus.train_tokenizer(data / "corpus", data / "corpus" / "tokenizer", vocab_size=1024)
    tasks = Path(args.tasks)
    if not (data / "tasks").exists():
        shutil.copytree(tasks, data / "tasks")
        _ensure_validation(data / "tasks", args.val_tasks)
    counts = fixes.build(data / "tasks", data / "corpus" / "tokenizer", data / "sft.jsonl.xz",
                         prompting=PROMPT)
    from_corpus = fixes.corpus_examples(data / "corpus" / "train.jsonl.xz", data / "corpus" / "tokenizer",
                                        data / "fixes" / "corpus.jsonl.xz", n=4, prompting=PROMPT,
                                        workers=1, rename_share=0.5)
    write(args.out, "prepare.json", {"sft_examples": counts, "corpus_examples": from_corpus})
    args.data = data
    args.name = "smoke"
    localisation_stage(args)
    pretrain(args)
    sft(args)
    args.model = args.out / "models" / "sft"
    grpo(args)


def _ensure_validation(tasks: Path, n: int) -> None:
    """A toy set may have no validation split (it is drawn per function): hold out its last `n` training tasks."""
    from envs.swe.taskset import read_split, write_jsonl

    train, val = read_split(tasks, "train"), read_split(tasks, "validation")
    if len(val) < n and len(train) > n:
        write_jsonl(tasks / "validation.jsonl", [*val, *train[-(n - len(val)):]])
        write_jsonl(tasks / "train.jsonl", train[: -(n - len(val))])


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="stage", required=True)
    pr = sub.add_parser("prepare")
    pr.add_argument("--out", type=Path, default=DATA / "results")
    pr.add_argument("--cache", type=Path, default=Path(os.environ.get("GRPO_FLEET_CACHE", ROOT / ".cache")))
    pr.add_argument("--locked", action="store_true", help="fetch exactly the sdists of speedrun/packages.lock")
    fx = sub.add_parser("fixes")
    fx.add_argument("--out", type=Path, default=DATA / "results")
    fx.add_argument("--data", type=Path, default=DATA)
    fx.add_argument("--corpus-fixes", type=int, default=8000, help="examples from the corpus's functions")
    fx.add_argument("--sft-tasks", type=Path, default=None, help="a task set built from speedrun/sft.yaml")
    fx.add_argument("--per-file", type=int, default=1, help="corpus fixes: at most this many per file")
    fx.add_argument("--rename-share", type=float, default=0.5,
                    help="corpus fixes: the share whose package gets an unseen name, so that paths are copied off "
                         "the prompt, not written from memory (speedrun/fixes.py `rename_project`)")
    fx.add_argument("--name", default="sft_tasks", help="--sft-tasks: examples go to fixes/NAME.jsonl.xz")
    fx.add_argument("--workers", type=int, default=None)
    fx.add_argument("--diff-context", type=int, default=3, help="context lines around each change of an SFT diff")
    tk = sub.add_parser("tokenizer")
    tk.add_argument("--data", type=Path, default=DATA, help="trains DATA/corpus/tokenizer on DATA/corpus")
    tk.add_argument("--out", type=Path, default=DATA / "results")
    cm = sub.add_parser("corpus-more", help="the training files the corpus's cap left out, in parts that travel")
    cm.add_argument("--data", type=Path, default=DATA, help="writes DATA/corpus/train-more-NNN.jsonl.xz")
    cm.add_argument("--cache", type=Path, default=Path(os.environ.get("GRPO_FLEET_CACHE", ROOT / ".cache")))
    cm.add_argument("--out", type=Path, default=DATA / "results")
    cm.add_argument("--part-mb", type=float, default=100.0, help="uncompressed MB a part (~16 MB as xz at 100)")
    cm.add_argument("--max-parts", type=int, default=None, help="write only the first N parts (hash order: a sample)")
    lo = sub.add_parser("localisation")
    lo.add_argument("--data", type=Path, default=DATA, help="DATA/tasks: the task set; DATA/corpus: the tokenizer")
    lo.add_argument("--out", type=Path, default=DATA / "results")
    lo.add_argument("--name", default="heldout", help="results go to OUT/localisation_NAME.json")
    dg = sub.add_parser("diagnose")
    dg.add_argument("--report", type=Path, required=True, help="a grpo_<mode>.json with logged answers")
    dg.add_argument("--data", type=Path, default=DATA)
    dg.add_argument("--out", type=Path, default=DATA / "results")
    dg.add_argument("--finish", action="store_true",
                    help="write into the report what `grpo` adds after the fleet (held-out changes, diagnosis)")
    rg = sub.add_parser("regrade", help="a report's not-applied held-out answers graded again by this sandbox")
    rg.add_argument("--report", type=Path, required=True, help="a grpo_<mode>.json with logged answers; the "
                    "figures go beside it, to grpo_<mode>.regraded.json")
    rg.add_argument("--data", type=Path, default=DATA)
    rg.add_argument("--workers", type=int, default=os.cpu_count() or 2, help="sandbox runs at a time")
    for name in ("pretrain", "sft-examples", "sft", "grpo", "smoke"):
        s = sub.add_parser(name)
        s.add_argument("--out", type=Path, required=True)
        s.add_argument("--data", type=Path, default=DATA)
        s.add_argument("--cpu", action="store_true", default=name == "smoke")
        s.add_argument("--rows-per-step", type=int, default=2 if name == "smoke" else None,
                       help="pre-training rows a step (default: 64 rows of 2,048 tokens' worth, whatever the prompt)")
        s.add_argument("--pretrain-steps", type=int, default=3 if name == "smoke" else 4000)
        s.add_argument("--pretrain-seconds", type=float, default=360.0)
        s.add_argument("--pretrain-lr", type=float, default=1.5e-3)
        s.add_argument("--eval-rows", type=int, default=4 if name == "smoke" else 256)
        s.add_argument("--sft-examples", type=int, default=4 if name == "smoke" else None)
        s.add_argument("--sft-epochs", type=float, default=1.0 if name == "smoke" else 3.0)
        s.add_argument("--task-weight", type=int, default=2)
        s.add_argument("--diff-context", type=int, default=3, help="sft-examples: context lines of an SFT diff")
        s.add_argument("--sft-batch", type=int, default=2 if name == "smoke" else None,
                       help="SFT examples a step (default: 32 at 1,792-token prompts, fewer in proportion to longer)")
        s.add_argument("--sft-lr", type=float, default=5e-4)
        s.add_argument("--sft-seconds", type=float, default=180.0)
        s.add_argument("--model", type=Path, default=None)
        s.add_argument("--sft-from-train", type=float, default=0.5)
        s.add_argument("--mode", choices=["sync", "async", "both"], default="both",
                       help="grpo: both = a sync and an async fleet side by side, half the sandbox's runners each")
        s.add_argument("--pool", type=int, default=None,
                       help="grpo: sandbox runners per fleet (default: the cores but 4, split between the fleets)")
        s.add_argument("--steps", type=int, default=1 if name == "smoke" else 40)
        s.add_argument("--prompts", type=int, default=2 if name == "smoke" else 16)
        s.add_argument("--generations", type=int, default=2 if name == "smoke" else 8)
        s.add_argument("--val-period", type=int, default=1 if name == "smoke" else 20)
        s.add_argument("--val-tasks", type=int, default=2 if name == "smoke" else 400)
        s.add_argument("--lr", type=float, default=1e-4,
                       help="GRPO's learning rate (the fourth run's 3e-5 moved nothing in 16 steps)")
        # pass_rate pays a patch that changes nothing its PASS_TO_PASS share, and GRPO learned exactly that here
        # (docs/swe-learning.md): only progress on the failing tests is credited.
        s.add_argument("--reward-mode", choices=get_args(RewardMode), default="fail_to_pass")
        # The fifth run paid -0.1 below an applied change (0): GRPO then learned to edit *something* that applies
        # (held-out no-change diffs 139 -> 11, tests broken 22 -> 61) and its held-out resolves fell from 6 to 0
        # (docs/swe-learning.md). With resolves this rare, any credit for applying swamps the resolve signal.
        s.add_argument("--format-error-reward", type=float, default=0.0,
                       help="env.code.format_error_reward: no diff, a diff that changes nothing or does not apply")
        s.add_argument("--timeout", type=float, default=240.0 if name == "smoke" else 540.0,
                       help="seconds the fleet may run (a device call may run 600)")
        s.add_argument("--max-train-s", type=float, default=None,
                       help="grpo.max_train_s: the training loop's budget, a last validation round after it (keep "
                            "--timeout above it by the start, the first round and the last)")
        s.add_argument("--train-kinds", default=None,
                       help="grpo: train on these bug kinds only: `in-place` (all but the remove_* kinds, which no "
                            "held-out answer of runs 3-5 resolved) or a comma-separated list; validation unchanged")
        s.add_argument("--train-frames", action="store_true",
                       help="grpo: train only on tasks whose statement's traceback passes through the library (the "
                            "raising line is then in the prompt: every one of the 120 held-out resolves of runs 4-6 "
                            "was such a task); validation unchanged")
        s.add_argument("--train-shown", action="store_true",
                       help="grpo: train only on tasks whose prompt shows every line their fix changes (the SFT "
                            "pairs' criterion, read off the gold patch of training tasks only): another task's group "
                            "holds no resolve and so no gradient; validation unchanged")
        s.add_argument("--run-root", type=Path, default=None,
                       help="grpo: the fleets' run folders, ROOT/sync and ROOT/async (default: OUT/runs)")
        s.add_argument("--resume", action="store_true",
                       help="grpo: continue the runs in --run-root from their checkpoints (another device call "
                            "while the machine stays warm); the report then covers both calls")
        s.add_argument("--diagnose", action=argparse.BooleanOptionalAction, default=True,
                       help="grpo: diagnose every logged held-out answer after the fleets (~40-60 s a report; "
                            "--no-diagnose leaves it to `diagnose --finish` on any machine)")
        s.add_argument("--task-timeout", type=float, default=20.0,
                       help="env.code.task_timeout: a sync step waits for its slowest verdict")
        s.add_argument("--tasks", default=str(ROOT / ".gpu" / "tasks"), help="smoke: the task set to use")
        s.add_argument("overrides", nargs="*", help="grpo: extra config overrides")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s [speedrun] %(message)s")
    stages = {"prepare": prepare, "fixes": fixes_stage, "pretrain": pretrain, "sft-examples": sft_examples,
              "sft": sft, "grpo": grpo, "smoke": smoke, "diagnose": diagnose_stage,
              "localisation": localisation_stage, "tokenizer": tokenizer_stage, "regrade": regrade_stage,
              "corpus-more": corpus_more_stage}
    stages[args.stage](args)


if __name__ == "__main__":
    main()
