"""The speedrun's GRPO reports read back (`swe_speedrun.py grpo`, `diagnose --finish`): held-out resolve rates
compared task by task with a paired bootstrap interval, why patches did not apply, and the diagnosis of every logged
held-out answer (`diagnose.py`)."""

from __future__ import annotations

import json
import logging
import lzma
import random
import re
from collections import Counter
from pathlib import Path
from typing import Any

import diagnose
from prompting import Prompting

from workshop.tinymodel import tokenizer_fingerprint

log = logging.getLogger("speedrun")


def answers_path(report: Path) -> Path:
    """Where a committed report keeps its logged held-out answers: beside it, xz-compressed (`grpo_sync.json` ->
    `grpo_sync.answers.json.xz`), because they are most of its size (1.2 of the fifth run's 2.2 MB)."""
    return report.with_name(report.name.removesuffix(".json") + ".answers.json.xz")


def load_report(path: Path) -> dict[str, Any]:
    """A GRPO report with its `validation_tasks`, from the report or from `answers_path` when it was moved out."""
    report: dict[str, Any] = json.loads(path.read_text())
    if "validation_tasks" not in report and answers_path(path).is_file():
        report["validation_tasks"] = json.loads(lzma.decompress(answers_path(path).read_bytes()))
    return report


def finish_report(path: Path, data: Path, prompting: Prompting, diagnosis: bool = True) -> None:
    """Add to a fleet's report the held-out changes with their intervals, why patches did not apply, and the
    diagnosis of every logged answer (`grpo` does it where it ran; `diagnose --finish` anywhere, for a report whose
    device call ran out before this step or left the diagnosis out: it rebuilds every prompt, ~40 s a report).
    The prompts are rebuilt with the prompting the report records (`prompting`, written here the first time)."""
    report = load_report(path)
    prompting = Prompting.from_figures(report.setdefault("prompting", prompting.figures()))
    report["heldout"] = heldout_changes(report["validation_tasks"])
    report["heldout_by_family"] = by_family(report["validation_tasks"], data)
    report["heldout_errors"] = [{"step": r["step"], "errors": error_kinds(r.get("errors", {}))}
                                for r in report["validation_tasks"]]
    if diagnosis:
        report["diagnosis"] = diagnose_rounds(report["validation_tasks"], data, prompting,
                                              tokenizer_sha256=report.get("tokenizer_sha256"))
    if answers_path(path).is_file():  # the answers stay where they were moved
        report.pop("validation_tasks")
    path.write_text(json.dumps(report, indent=1))
    log.info("held-out resolve rate: %s", json.dumps(report["heldout"]))
    log.info("%s held-out resolved by round: %s", path.name,
             ", ".join(f"step {r['step']}: {r['resolved']}" for r in report["heldout"]))
    for r in report.get("diagnosis", []):
        log.info("step %s answers: %s gold: %s; %s of %s as the tokenizer encodes them", r["step"],
                 json.dumps(r["kinds"]), json.dumps(r["gold"]), r.get("as_encoded", "?"), r["answers"])


def check_tokenizer(data: Path, tokenizer_sha256: str | None) -> None:
    """The logged answers are token ids: decoded with another tokenizer than the one that wrote them, they read as
    garbage and the diagnosis is silently wrong. A report names its model's tokenizer (`tokenizer_sha256`); the
    reports of runs 1-7 do not (the eighth run's were given theirs afterwards; runs 1-8 used Qwen2's split, which
    `swe_speedrun.py tokenizer` keeps as `DATA/tokenizer.previous`)."""
    have = tokenizer_fingerprint(data / "corpus" / "tokenizer")
    if tokenizer_sha256 is None:
        log.warning("the report does not name its tokenizer: its answers are decoded with %s/corpus/tokenizer "
                    "(sha256 %s), which must be the one that wrote them", data, have[:12])
    elif tokenizer_sha256 != have:
        raise ValueError(f"the report's answers were written with tokenizer sha256 {tokenizer_sha256[:12]}, but "
                         f"{data}/corpus/tokenizer is {have[:12]}: diagnose them with the tokenizer that wrote them")


def diagnose_rounds(rounds: list[dict[str, Any]], data: Path, prompting: Prompting,
                    tokenizer_sha256: str | None = None) -> list[dict[str, Any]]:
    """`speedrun/diagnose.py` over the rounds' logged answers, with the prompts they answered (rebuilt as GRPO
    builds them) to tell a line copied from elsewhere in the prompt from one made up."""
    from envs.swe.taskset import read_split
    from fleet.tokenizer import load_tokenizer

    check_tokenizer(data, tokenizer_sha256)
    ids = {t for r in rounds for t in r.get("answers", {})}
    if not ids:
        return []
    tasks = {t.instance_id: t for split in ("train", "validation") for t in read_split(data / "tasks", split)
             if t.instance_id in ids}
    tok = load_tokenizer(data / "corpus" / "tokenizer")
    prompts = {i: prompting.build(t, tok, data / "tasks" / "repos").text for i, t in tasks.items()}
    return diagnose.round_table(rounds, tasks, tok, data / "tasks" / "repos", prompts)


def error_kinds(errors: dict[str, str], top: int = 12) -> dict[str, int]:
    """How many tasks' verdict errors share a first line once paths and numbers are blanked (`error: patch failed:
    PATH:N`): why patches do not apply, at a glance."""
    def kind(text: str) -> str:
        first = (text.strip().splitlines() or [""])[0]
        first = re.sub(r"[\w./-]*\.py\b", "PATH", first)
        return re.sub(r"\d+", "N", first)[:120]

    return dict(Counter(kind(e) for e in errors.values()).most_common(top))


def paired_bootstrap(before: list[bool], after: list[bool], *, samples: int = 10_000,
                     seed: int = 0) -> tuple[float, float, float]:
    """Change of the resolve rate from `before` to `after` (the same tasks, in order) with a 95% bootstrap interval:
    tasks resampled with replacement, each keeping its own pair of outcomes."""
    n = len(before)
    diffs = [int(a) - int(b) for b, a in zip(before, after, strict=True)]
    if not n:
        return 0.0, 0.0, 0.0
    rng = random.Random(seed)
    stats = sorted(sum(diffs[rng.randrange(n)] for _ in range(n)) / n for _ in range(samples))
    return sum(diffs) / n, stats[int(0.025 * samples)], stats[int(0.975 * samples) - 1]


def heldout_changes(rounds: list[dict[str, Any]], only: set[str] | None = None) -> list[dict[str, Any]]:
    """Per validation round: resolved tasks, and the change since the first round with its 95% bootstrap interval
    (infrastructure errors in either round leave the task out of the pair); `only`: these tasks alone."""
    if not rounds:
        return []
    first = rounds[0]["verdicts"]
    out = []
    for r in rounds:
        tasks = sorted(t for t, k in r["verdicts"].items()
                       if k != "infra_error" and first.get(t, "infra_error") != "infra_error"
                       and (only is None or t in only))
        diff, lo, hi = paired_bootstrap([first[t] == "resolved" for t in tasks],
                                        [r["verdicts"][t] == "resolved" for t in tasks])
        out.append({"step": r["step"], "tasks": len(tasks),
                    "resolved": sum(r["verdicts"][t] == "resolved" for t in tasks),
                    "change": diff, "change_ci95": [lo, hi]})
    return out


# Bugs whose fix writes code back; the others edit a line in place (`swe_speedrun.py grpo --train-kinds in-place`
# trains on those alone).
REMOVAL_KINDS = frozenset({"remove_assign", "remove_cond", "remove_loop"})


def by_family(rounds: list[dict[str, Any]], data: Path) -> dict[str, list[dict[str, Any]]]:
    """`heldout_changes` over the held-out bugs fixed by editing a line in place and over those whose fix writes
    code back (`REMOVAL_KINDS`): the same evaluation, split so that a recipe training on one family shows where
    its change lies."""
    from envs.swe.taskset import read_split

    return family_changes(rounds, {t.instance_id: str(t.metadata.get("bug_kind"))
                                   for t in read_split(data / "tasks", "validation")})


def family_changes(rounds: list[dict[str, Any]], kinds: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """`by_family` with each task's bug kind given."""
    removal = {t for t, k in kinds.items() if k in REMOVAL_KINDS}
    return {"in_place": heldout_changes(rounds, set(kinds) - removal), "removal": heldout_changes(rounds, removal)}
