"""The SWE speedrun's stages end to end at toy size on CPU (`swe_speedrun.py smoke`): corpus -> tokenizer -> a
model from random weights pre-trained through the trainer's code -> SFT on the task set's fixes -> GRPO through the
whole fleet (Redis, buffer, sandbox, rollout worker, torchrun trainer) with greedy validation before and after."""

from __future__ import annotations

import json
import lzma
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def fixes_rows(path: Path) -> list[dict]:
    with lzma.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def test_every_stage_runs_and_reports_its_figures(task_slice: Path, tmp_path: Path) -> None:
    out = tmp_path / "speedrun"
    # A prompt setting other than the defaults, as a run chooses it: every stage must build the same prompt.
    env = {**os.environ, "SPEEDRUN_MAX_PROMPT": "1536", "SPEEDRUN_CONTEXT_FUNCTIONS": "8"}
    prompting = {"max_prompt_length": 1536, "context": "bm25_functions", "context_functions": 8}
    proc = subprocess.run([sys.executable, "benchmarks/swe_speedrun.py", "smoke", "--out", str(out), "--tasks",
                           str(task_slice)], cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "pretrain.json").read_text())["prompting"] == prompting
    assert json.loads((out / "models" / "sft" / "config.json").read_text())["max_position_embeddings"] == 1536 + 256
    assert all({k: row[k] for k in prompting} == prompting for row in fixes_rows(out / "data" / "sft.jsonl.xz"))
    prepared = json.loads((out / "prepare.json").read_text())["sft_examples"]
    assert prepared["examples"] >= 1 and prepared["examples"] + prepared.get("fix_not_in_prompt", 0) == \
        prepared["tasks"]
    from_corpus = json.loads((out / "prepare.json").read_text())["corpus_examples"]
    assert from_corpus["examples"] == 4 and from_corpus["files"] >= 4
    where = json.loads((out / "localisation_smoke.json").read_text())
    assert where["tasks"] >= 2 and where["function_first"] <= where["function_in_context"] <= where["tasks"]
    pre = json.loads((out / "pretrain.json").read_text())
    assert pre["steps"] >= 1 and math.isfinite(pre["heldout_bits_per_byte"]) and pre["heldout_bits_per_byte"] > 0
    assert pre["train_parts"] == ["train.jsonl.xz", "train-more-000.jsonl.xz"]
    sft = json.loads((out / "sft.json").read_text())
    assert sft["steps"] >= 1 and all(math.isfinite(p["loss"]) for p in sft["curve"])
    # The SFT model's folder spells every gold-patch path alike in the code header and the diff (the path split).
    assert sft["paths_spelt_alike"]["alike"] == sft["paths_spelt_alike"]["paths"] > 0
    # The SFT model is an HF folder the fleet serves and trains.
    assert (out / "models" / "sft" / "config.json").is_file() and (out / "models" / "sft" / "tokenizer.json").is_file()
    # The smoke runs a sync and an async fleet side by side (`--mode both`, as the lent GPU does), each logging apart.
    for mode in ("sync", "async"):
        assert (out / f"grpo_{mode}.log").stat().st_size > 0
        grpo = json.loads((out / f"grpo_{mode}.json").read_text())
        assert grpo["mode"] == mode and grpo["prompting"] == prompting
        fleet_cfg = (out / "runs" / mode / "config.yaml").read_text()
        assert "context_functions: 8" in fleet_cfg and "max_prompt_length: 1536" in fleet_cfg
        assert grpo["fleet"]["rc"] == 0 and not grpo["accounting"]["violations"]
        rounds = grpo["validation"]
        assert len(rounds) == 2 and all(r["val/tasks"] == 2 for r in rounds)
        assert [r["val/step"] for r in rounds] == [0.0, 1.0]
        # Every validation task got exactly one verdict kind, and each round's verdicts are kept per task.
        for r in rounds:
            assert sum(v for k, v in r.items() if k.startswith("val/verdict/")) == r["val/tasks"]
        per_task = grpo["validation_tasks"]
        assert [r["step"] for r in per_task] == [0, 1] and all(len(r["verdicts"]) == 2 for r in per_task)
        # The answers of the first `logger.val_answers_logged` tasks (the speedrun logs all) are kept, as token ids.
        assert all(len(r["answers"]) == 2 and all(isinstance(t, int) for a in r["answers"].values() for t in a)
                   for r in per_task)
        assert all(set(r["errors"]) <= set(r["verdicts"]) for r in per_task)
        assert [h["step"] for h in grpo["heldout"]] == [0, 1] and grpo["heldout"][0]["change"] == 0.0
        # The same rounds split into bugs fixed in place and bugs whose fix writes code back: they add up.
        fam = grpo["heldout_by_family"]
        assert [a["tasks"] + b["tasks"] for a, b in zip(fam["in_place"], fam["removal"], strict=True)] == \
            [h["tasks"] for h in grpo["heldout"]]
        # Every logged answer is diagnosed against its task's code (speedrun/diagnose.py), one kind each.
        assert [d["step"] for d in grpo["diagnosis"]] == [0, 1]
        assert all(sum(d["kinds"].values()) == d["answers"] == 2 for d in grpo["diagnosis"])
    # A later device call continues both runs from the checkpoints the first wrote (`grpo --resume`): the trainer
    # resumes at step 1 without validating the same weights again, and the report then holds both calls' rounds.
    resume = [sys.executable, "benchmarks/swe_speedrun.py", "grpo", "--cpu", "--resume", "--out", str(out), "--data",
              str(out / "data"), "--model", str(out / "models" / "sft"), "--steps", "2", "--prompts", "2",
              "--generations", "2", "--val-period", "1", "--val-tasks", "2", "--timeout", "240"]
    # Without the setting, the default prompt (1792 + 256 tokens) would not fit the model's 1792 positions.
    proc = subprocess.run(resume, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in env.items() if not k.startswith("SPEEDRUN_")})
    assert proc.returncode != 0 and "1792 positions, fewer than this run's prompts" in proc.stderr, proc.stderr
    proc = subprocess.run(resume, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for mode in ("sync", "async"):
        trainer_log = (out / "runs" / mode / "logs" / "processes" / "trainer.log").read_text()
        assert "resuming from" in trainer_log and "step_00000001" in trainer_log
        # The continuation's sandbox read the trees the first call graded (`sandbox.tree_cache_path`).
        sandbox_log = (out / "runs" / mode / "logs" / "processes" / "sandbox.log").read_text()
        assert f"verdicts read from {out / 'runs' / mode / 'tree_cache.jsonl'}" in sandbox_log
        grpo = json.loads((out / f"grpo_{mode}.json").read_text())
        assert grpo["fleet"]["rc"] == 0 and not grpo["accounting"]["violations"]
        assert [r["val/step"] for r in grpo["validation"]] == [0.0, 1.0, 2.0]
        assert grpo["trained_groups"]["steps"] == 2 and grpo["trained_groups"]["unique"] == 4
        assert [h["step"] for h in grpo["heldout"]] == [0, 1, 2]
        # Both calls' steps named the tasks they trained on.
        assert grpo["training_tasks"]["steps"] == 2 and grpo["training_tasks"]["groups"] == 4
        # Each call's worker summary comes with the report (the second call's worker did not write over the first's);
        # every answer that reached a sandbox was a hit or a miss.
        assert len(grpo["workers"]) == 2
        assert all({"hits", "misses", "kept"} == set(worker["verdict_cache"]) for worker in grpo["workers"])


def stdlib_tokenizer(data: Path) -> Path:
    """DATA/corpus/tokenizer: the speedrun's BPE (1,024 tokens) trained on 30 standard-library files, as `smoke`
    trains its own."""
    import lzma
    import sysconfig

    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "speedrun")]
    import corpus

    (data / "corpus").mkdir(parents=True)
    with lzma.open(data / "corpus" / "train.jsonl.xz", "wt") as f:
        for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:30]:
            f.write(json.dumps({"package": "stdlib", "path": p.name, "text": p.read_text()}) + "\n")
    corpus.train_tokenizer(data / "corpus", data / "corpus" / "tokenizer", vocab_size=1024)
    return data / "corpus" / "tokenizer"


def test_train_shown_keeps_the_training_tasks_whose_prompt_shows_their_fix(task_slice: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`grpo --train-shown` on a real built slice: the training split it writes holds exactly the tasks `fixes.build`
    makes SFT pairs of (the same prompts, tokenizer and budget), and the validation split stays whole."""
    import shutil

    tokenizer = stdlib_tokenizer(tmp_path)  # puts benchmarks/ and benchmarks/speedrun/ on the path
    import fixes
    import swe_speedrun
    from prompting import Prompting

    # A budget that leaves some of the slice's fixes out (a 1,024-token vocabulary: at 1,024 tokens two of six toolz
    # fixes are out of their prompts here; at the default 1,792 none is).
    monkeypatch.setattr(swe_speedrun, "PROMPT", Prompting(max_prompt_length=1024))
    tasks = tmp_path / "tasks"
    shutil.copytree(task_slice, tasks)
    validation = (tasks / "validation.jsonl").read_text()

    counts = fixes.build(tasks, tokenizer, tmp_path / "sft.jsonl.xz", prompting=swe_speedrun.PROMPT,
                         splits=("train",))
    paired = [r["instance_id"] for r in fixes.read(tmp_path / "sft.jsonl.xz")]
    assert counts["tasks"] == len((tasks / "train.jsonl").read_text().splitlines())
    name, n = swe_speedrun.train_split(tasks, None, frames=False, shown=tokenizer)
    chosen = [json.loads(line)["instance_id"] for line in (tasks / f"{name}.jsonl").read_text().splitlines()]
    assert n == len(paired) >= 1 and chosen == paired
    assert n < counts["tasks"]
    assert (tasks / "validation.jsonl").read_text() == validation


def test_regrade_grades_a_not_applied_answer_again_through_the_sandboxs_apply_chain(task_slice: Path,
                                                                                      tmp_path: Path) -> None:
    """`swe_speedrun.py regrade` on a report in the fleet's layout: an answer logged `patch_not_applied` whose only
    fault is a context line (the gold fix with its first context line changed) is graded again by the real sandbox,
    which applies it as SWE-bench's harness does, and resolves; the paired change counts it."""
    import shutil

    from envs.swe.taskset import read_split
    from fleet.tokenizer import load_tokenizer

    data = tmp_path / "data"
    tok = load_tokenizer(stdlib_tokenizer(data))  # puts benchmarks/speedrun/ on the path
    import regrade

    shutil.copytree(task_slice, data / "tasks")
    # The slice is one training repository; its first task stands in for a held-out one.
    (data / "tasks" / "validation.jsonl").write_text((task_slice / "train.jsonl").read_text().splitlines()[0] + "\n")
    task = read_split(data / "tasks", "validation")[0]
    lines = task.patch.splitlines(keepends=True)
    first_context = next(i for i, line in enumerate(lines) if line.startswith(" ") and i > 3)
    lines[first_context] = " # a line that is not in the file\n"
    off = "".join(lines)
    answer = tok("```diff\n" + off + "```")["input_ids"]
    rounds = [{"step": s, "verdicts": {task.instance_id: "patch_not_applied"}, "answers": {task.instance_id: answer}}
              for s in (0, 1)]
    rounds[0]["answers"] = {}  # no logged answer: kept as it was logged
    report = tmp_path / "grpo_sync.json"
    report.write_text(json.dumps({"validation_tasks": rounds}))
    figures = regrade.regrade(report, data, workers=1)
    assert figures["sandbox_runs"] == 1
    assert [r["now_resolved"] for r in figures["rounds"]] == [[], [task.instance_id]]
    assert [r["resolved"] for r in figures["heldout_logged"]] == [0, 0]
    assert [r["resolved"] for r in figures["heldout_now"]] == [0, 1] and figures["heldout_now"][1]["change"] == 1.0
