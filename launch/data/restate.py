"""Rewrite a built task set's problem statements under its recipe's `statement_frames`, without rebuilding it.

A statement is written from the buggy tree's failing test run. Rebuilding a set to change how statements read would
draw and validate every candidate again (several sandbox runs per task, most of them rejected); restating runs
each kept task's failing tests once, on the same `base_commit` with the same command, and writes the statement
that the builder would have written from that output. Everything else in a row stays byte for byte. A row whose
rerun does not fail as the row says (an infrastructure error, a timeout, a FAIL_TO_PASS test that now passes)
keeps its statement and is counted, never dropped.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.swe.paths import repos_dir
from envs.swe.taskset import SPLITS, read_manifest, write_manifest
from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import TaskSpec
from launch.data.recipe import Recipe
from launch.data.statement import write_statement
from launch.data.validate import Runner, is_passing, run_with_retry

# The builder's per-candidate timeout is at most this (twice the clean suite, capped): a restate run is one of those.
RUN_TIMEOUT_S = 60.0


@dataclass
class RestateReport:
    rows: int = 0
    changed: int = 0
    kept: Counter[str] = field(default_factory=Counter)
    """Rows whose statement stayed as it was, by why: `infra_error`, `timeout`, `not_failing` (a FAIL_TO_PASS test
    passed on the rerun), `unknown_repo` (the recipe does not name the row's repository)."""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"rows": self.rows, "changed": self.changed, "kept": dict(self.kept), "seconds": round(self.seconds, 1)}


# What a row needs to be rerun and restated: the builder writes them all; a hub dataset's rows lack some.
_NEEDED = ("instance_id", "repo", "repo_url", "base_commit", "test_command", "package", "version", "FAIL_TO_PASS",
           "PASS_TO_PASS", "problem_statement")


async def restate_row(row: dict[str, Any], recipe: Recipe, run: Runner) -> tuple[str | None, str]:
    """The statement `row` gets under `recipe.statement_frames`, or None and why it keeps its own."""
    missing = [k for k in _NEEDED if k not in row]
    if missing:
        raise ValueError(f"row {row.get('instance_id', '?')!r} lacks {', '.join(missing)}: restate rewrites task "
                         "sets made by `grpo-fleet data build`, whose statements it can write again")
    try:
        repo = recipe.repo(row["repo"])
    except KeyError:
        return None, "unknown_repo"
    f2p = list(row["FAIL_TO_PASS"])
    spec = TaskSpec(repo_url=row["repo_url"], base_commit=row["base_commit"], patch="",
                    test_command=row["test_command"], fail_to_pass=f2p, pass_to_pass=list(row["PASS_TO_PASS"]),
                    timeout=RUN_TIMEOUT_S)
    verdict = await run_with_retry(run, spec)
    if verdict.status != "completed":
        return None, verdict.status
    if any(is_passing(verdict.test_status.get(t, "MISSING")) for t in f2p):
        return None, "not_failing"
    statement = write_statement(row["instance_id"], row["package"], row["version"], f2p,
                                verdict.stdout_tail + "\n" + verdict.stderr_tail, tuple(repo.tests),
                                library_frames=recipe.statement_frames == "repository")
    return statement, "changed"


async def restate_rows(rows: list[dict[str, Any]], recipe: Recipe, run: Runner, concurrency: int,
                       report: RestateReport) -> list[dict[str, Any]]:
    """`rows` with their statements rewritten (new dicts, in the same order)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            statement, why = await restate_row(row, recipe, run)
        report.rows += 1
        if statement is None:
            report.kept[why] += 1
            return row
        report.changed += statement != row["problem_statement"]
        return {**row, "problem_statement": statement}

    return list(await asyncio.gather(*(one(r) for r in rows)))


async def restate_taskset(folder: Path, recipe: Recipe, workers: int, sandbox: SandboxConfig | None = None
                          ) -> RestateReport:
    """Restate every split of the task set in `folder`, in place (each split replaced whole, then the manifest)."""
    from services.sandbox.executor import Executor

    t0 = time.monotonic()
    report = RestateReport()
    splits = [s for s in SPLITS if (folder / f"{s}.jsonl").is_file()]
    if not splits:
        raise FileNotFoundError(f"no task set in {folder}: neither train.jsonl nor validation.jsonl")
    base = sandbox or SandboxConfig()
    config = base.model_copy(update={"repos_root": str(repos_dir(folder).resolve()), "pool_size": workers})
    async with Executor(config) as executor:
        for split in splits:
            path = folder / f"{split}.jsonl"
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            restated = await restate_rows(rows, recipe, executor.run, workers, report)
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in restated),
                           encoding="utf-8")
            os.replace(tmp, path)
    report.seconds = time.monotonic() - t0
    manifest = read_manifest(folder)
    manifest["recipe_fingerprint"] = recipe.fingerprint()
    manifest["restated"] = {"statement_frames": recipe.statement_frames, **report.to_json()}
    write_manifest(folder, manifest)
    return report
