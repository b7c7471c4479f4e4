"""What SWE-bench's apply chain costs the sandbox against `git apply` alone, on answers a model wrote, in one sitting:

    .venv/bin/python benchmarks/apply_chain_bench.py \
        --report benchmarks/results/swe_speedrun/eleventh_run/grpo_sync.json

The held-out answers a speedrun report logged as `patch_not_applied` (the ones the chain can change) and as applied
are applied to a fresh checkout of their task, once with `Workspace.apply` (`git apply`, what the host sandbox ran
before the eleventh run) and once with `Workspace.apply_as_harness` (swebench's `GIT_APPLY_CMDS`, the tree reset after
each failed command that can leave part of the patch behind), alternating which goes first. Reports the seconds
each takes (median, p90) and how many answers each applied. Needs `.speedrun` (`--data`) with the report's
tokenizer. Writes `benchmarks/results/apply_chain.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks" / "speedrun")]

from regrade import logged_patches  # noqa: E402
from report import load_report  # noqa: E402

from envs.swe.taskset import read_split  # noqa: E402
from services.sandbox.fstree import remove_path  # noqa: E402
from services.sandbox.workspace import PatchError, Workspace  # noqa: E402


async def timed(repo: Path, commit: str, patch: str, chain: bool) -> tuple[float, bool]:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Workspace(Path(tmp) / "ws")
        await ws.checkout(repo, commit)
        t = time.perf_counter()
        try:
            await (ws.apply_as_harness if chain else ws.apply)("agent.diff", patch)
            applied = True
        except PatchError:
            applied = False
        seconds = time.perf_counter() - t
        remove_path(ws.root)
    return seconds, applied


def answers(report_path: Path, data: Path, limit: int) -> list[tuple[str, str, str]]:
    """(task, logged verdict, patch) of the last round's answers with a diff, not-applied ones first."""
    report = load_report(report_path)
    kinds = report["validation_tasks"][-1]["verdicts"]
    last = logged_patches(report, data, frozenset({"patch_not_applied", "tests_failed", "resolved"}))[-1]
    chosen = sorted(last.items(), key=lambda tp: kinds[tp[0]] != "patch_not_applied")
    return [(task, kinds[task], patch) for task, patch in chosen][:limit]


async def bench(report: Path, data: Path, limit: int) -> dict[str, object]:
    tasks = {t.instance_id: t for t in read_split(data / "tasks", "validation")}
    rows: list[dict[str, Any]] = []
    for i, (task_id, kind, patch) in enumerate(answers(report, data, limit)):
        task = tasks[task_id]
        repo = data / "tasks" / "repos" / f"{task.repo}.git"
        order = (False, True) if i % 2 else (True, False)
        got = {chain: await timed(repo, task.base_commit, patch, chain) for chain in order}
        rows.append({"task": task_id, "logged": kind, "git_s": got[False][0], "chain_s": got[True][0],
                     "git_applied": got[False][1], "chain_applied": got[True][1]})

    def stats(key: str, logged: str) -> dict[str, float]:
        xs = sorted(r[key] for r in rows if (r["logged"] == "patch_not_applied") == (logged == "not_applied"))
        return {"n": len(xs), "median": statistics.median(xs) if xs else 0.0,
                "p90": xs[int(0.9 * (len(xs) - 1))] if xs else 0.0}

    return {"report": str(report), "host": platform.node(), "answers": len(rows),
            "not_applied": {"git_s": stats("git_s", "not_applied"), "chain_s": stats("chain_s", "not_applied"),
                            "chain_applied": sum(r["chain_applied"] for r in rows
                                                 if r["logged"] == "patch_not_applied")},
            "applied": {"git_s": stats("git_s", "applied"), "chain_s": stats("chain_s", "applied")},
            "disagree_on_applied_answers": sum(r["git_applied"] != r["chain_applied"] for r in rows
                                               if r["logged"] != "patch_not_applied"),
            "rows": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--report", type=Path, required=True)
    p.add_argument("--data", type=Path, default=ROOT / ".speedrun")
    p.add_argument("--limit", type=int, default=200, help="answers to apply both ways")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "apply_chain.json")
    args = p.parse_args()
    figures = asyncio.run(bench(args.report, args.data, args.limit))
    args.out.write_text(json.dumps(figures, indent=1) + "\n")
    summary = {k: v for k, v in figures.items() if k != "rows"}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
