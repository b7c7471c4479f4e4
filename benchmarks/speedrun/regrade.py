"""A GRPO report's logged held-out answers graded again by this tree's sandbox (CPU, here or anywhere).

After a change to the grading, the runs already made say what it changes: the eleventh run's answers, graded
again once the host sandbox applied patches through SWE-bench's apply chain (`patch --fuzz=5` after `git apply`,
docs/services/sandbox.md), show how many held-out answers `git apply` alone had scored `patch_not_applied` that
SWE-bench's harness grades on their tests. Only those answers are run again: every command of the chain accepts
what the one before it did, so an answer that applied keeps its verdict. Each distinct (task, patch) runs once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from report import check_tokenizer, heldout_changes, load_report


def logged_patches(report: dict[str, Any], data: Path, kinds: frozenset[str]) -> list[dict[str, str]]:
    """Per validation round of `report`, task -> the patch its logged answer holds (as the fleet reads it off the
    decoded answer), for the tasks whose logged verdict is one of `kinds`; answers with no patch are left out."""
    from envs.swe.patch import extract_patch
    from fleet.tokenizer import load_tokenizer

    check_tokenizer(data, report.get("tokenizer_sha256"))
    tok = load_tokenizer(data / "corpus" / "tokenizer")
    rounds = []
    for r in report["validation_tasks"]:
        answers = r.get("answers", {})
        patches = {t: extract_patch(str(tok.decode(answers[t], skip_special_tokens=True))).patch
                   for t, kind in r["verdicts"].items() if kind in kinds and t in answers}
        rounds.append({t: p for t, p in patches.items() if p})
    return rounds


async def _grade(specs: dict[tuple[str, str], Any], data: Path, workers: int) -> dict[tuple[str, str], str]:
    from fleet.config.infra import SandboxConfig
    from services.sandbox.executor import Executor
    from trainer.validation import verdict_kind

    config = SandboxConfig(repos_root=str((data / "tasks" / "repos").resolve()), pool_size=workers)
    sem = asyncio.Semaphore(2 * workers)

    async def one(spec: Any) -> str:
        async with sem:
            return verdict_kind(await executor.run(spec))  # the bucket the fleet's validation logs

    async with Executor(config) as executor:
        kinds = await asyncio.gather(*(one(s) for s in specs.values()))
    return dict(zip(specs, kinds, strict=True))


def regrade(report_path: Path, data: Path, *, workers: int = 2, timeout_s: float = 20.0) -> dict[str, Any]:
    """Every round of `report_path` with its `patch_not_applied` answers graded again; the rounds' resolves and
    their paired change since the first round (`report.heldout_changes`), as logged and as graded now."""
    from envs.swe.payload import payload_to_spec, task_to_payload
    from envs.swe.taskset import read_split

    report = load_report(report_path)
    rounds = report["validation_tasks"]
    tasks = {t.instance_id: t for t in read_split(data / "tasks", "validation")}
    patches = {(i, task): patch
               for i, found in enumerate(logged_patches(report, data, frozenset({"patch_not_applied"})))
               for task, patch in found.items()}
    specs = {(task, patch): payload_to_spec(task_to_payload(tasks[task]), patch, timeout=timeout_s)
             for (_, task), patch in patches.items()}
    graded = asyncio.run(_grade(specs, data, workers))
    now = [{"step": r["step"], "verdicts": {t: graded.get((t, patches[i, t]), k) if (i, t) in patches else k
                                            for t, k in r["verdicts"].items()}}
           for i, r in enumerate(rounds)]
    return {"report": str(report_path), "sandbox_runs": len(specs),
            "rounds": [{"step": r["step"], "regraded": sum(1 for j, _ in patches if j == i),
                        "now_applied": sum(1 for (j, t), p in patches.items()
                                           if j == i and graded[t, p] != "patch_not_applied"),
                        "now_resolved": sorted(t for (j, t), p in patches.items()
                                               if j == i and graded[t, p] == "resolved")}
                       for i, r in enumerate(rounds)],
            "heldout_logged": heldout_changes(rounds), "heldout_now": heldout_changes(now)}
