"""`grpo-fleet data validate --gold N`: does a dataset's reward measure anything? Each row's gold patch must resolve
FULL and its empty patch must not (NO), graded by the same sandbox code that grades rollouts.

A gold patch scored NO is a silent zero: every answer to that task earns 0 whatever it does, so the task trains
nothing and the run's reward curve reads as a policy that cannot learn. The usual causes are a log the grader cannot
parse (`not gradable`), an image or checkout that does not build (`infra_error`), or test lists that do not match
the tests. An empty patch scored FULL is the opposite silent failure: doing nothing earns the reward.

The runs go through a `Runner` (one TaskSpec -> one Verdict): an in-process executor, or the sandbox service's
executors by URL; this module does not know which.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envs.registry import Task
from envs.swe.payload import payload_to_spec, task_to_payload
from fleet.contracts.sandbox import TaskSpec, Verdict
from sandbox_client.verdicts import is_not_gradable

if TYPE_CHECKING:
    from fleet.config import MasterConfig

Runner = Callable[[TaskSpec], Awaitable[Verdict]]


def verdict_kind(v: Verdict) -> str:
    """FULL / PARTIAL / NO for tests that ran and were graded; otherwise why there is no resolution to read."""
    if v.is_infra_failure:
        return "infra_error"
    if is_not_gradable(v):
        return "not_gradable"
    if v.status == "completed":
        return v.resolution
    return v.status  # not_applied, timeout, refused, integrity_violation


@dataclass(frozen=True)
class RowCheck:
    """One row's two runs."""

    instance_id: str
    repo: str
    gold: Verdict
    empty: Verdict

    @property
    def gold_kind(self) -> str:
        return verdict_kind(self.gold)

    @property
    def empty_kind(self) -> str:
        return verdict_kind(self.empty)

    @property
    def ok(self) -> bool:
        return self.gold_kind == "FULL" and self.empty_kind == "NO"

    def describe(self) -> str:
        """`gold NO (eval log not gradable ...); empty NO` -- the verdicts' status and the start of their error."""
        def one(name: str, v: Verdict, kind: str) -> str:
            error = " ".join(v.error.split())[:200]
            return f"{name} {kind}" + (f" ({error})" if error else "")

        return f"{one('gold', self.gold, self.gold_kind)}; {one('empty', self.empty, self.empty_kind)}"


def pick_rows(tasks: Sequence[Task], n: int) -> list[Task]:
    """`n` rows (0: all), round-robin over the repos in the order they first appear, each repo's rows in file order:
    a SWE-bench file is sorted by repo, and its first N rows would all be one repo's."""
    if n <= 0 or n >= len(tasks):
        return list(tasks)
    by_repo: dict[str, list[Task]] = defaultdict(list)
    for t in tasks:
        by_repo[t.repo or t.repo_url].append(t)
    queues = list(by_repo.values())
    picked: list[Task] = []
    depth = 0
    while len(picked) < n:
        picked += [q[depth] for q in queues if depth < len(q)][: n - len(picked)]
        depth += 1
    return picked


async def check_rows(tasks: Sequence[Task], run: Runner, *, concurrency: int, timeout_s: float,
                     on_done: Callable[[RowCheck], None] | None = None) -> list[RowCheck]:
    """Both runs of every row, at most `concurrency` sandbox runs at a time; results in row order."""
    sem = asyncio.Semaphore(concurrency)

    async def bounded(spec: TaskSpec) -> Verdict:
        async with sem:
            verdict = await run(spec)
        # One retry of an infrastructure failure: a flaky pull or a busy executor says nothing about the row.
        if verdict.is_infra_failure:
            async with sem:
                verdict = await run(spec)
        return verdict

    async def one(task: Task) -> RowCheck:
        payload = task_to_payload(task)
        gold, empty = await asyncio.gather(bounded(payload_to_spec(payload, task.patch, timeout=timeout_s)),
                                           bounded(payload_to_spec(payload, "", timeout=timeout_s)))
        row = RowCheck(task.instance_id, task.repo or task.repo_url, gold, empty)
        if on_done is not None:
            on_done(row)
        return row

    return list(await asyncio.gather(*(one(t) for t in tasks)))


COLUMNS = ("rows", "gold FULL", "empty NO", "not gradable", "infra errors")


def _counts(rows: Sequence[RowCheck]) -> dict[str, int]:
    kinds = Counter(k for r in rows for k in (r.gold_kind, r.empty_kind))
    return {"rows": len(rows), "gold FULL": sum(r.gold_kind == "FULL" for r in rows),
            "empty NO": sum(r.empty_kind == "NO" for r in rows), "not gradable": kinds["not_gradable"],
            "infra errors": kinds["infra_error"]}


def per_repo(rows: Sequence[RowCheck]) -> dict[str, dict[str, int]]:
    groups: dict[str, list[RowCheck]] = defaultdict(list)
    for r in rows:
        groups[r.repo].append(r)
    return {repo: _counts(rs) for repo, rs in sorted(groups.items())}


def format_report(rows: Sequence[RowCheck]) -> str:
    """The per-repo table with its total (`not gradable` and `infra errors` count runs: gold and empty), then each
    failing row."""
    table = per_repo(rows)
    total = _counts(rows)
    width = max([len("repo"), len("total"), *(len(r) for r in table)])
    head = f"{'repo':<{width}}  " + "  ".join(COLUMNS) + "  gold resolve rate"

    def line(name: str, c: dict[str, int]) -> str:
        cells = "  ".join(f"{c[k]:>{len(k)}}" for k in COLUMNS)
        rate = f"{c['gold FULL'] / c['rows']:.0%}" if c["rows"] else "-"
        return f"{name:<{width}}  {cells}  {rate:>17}"

    out = [head, *(line(repo, c) for repo, c in table.items()), "-" * len(head), line("total", total)]
    cost = run_times(rows)
    if cost["runs"]:
        run = cost["phases"]["total_s"]
        phases = ", ".join(f"{k.removesuffix('_s')} {v['median']:.2f}" for k, v in cost["phases"].items()
                           if k not in ("total_s", "queued_s"))
        out += ["", f"one sandbox run: median {run['median']:.2f} s, p90 {run['p90']:.2f} s, slowest "
                    f"{run['max']:.2f} s ({phases}; medians in s, over {cost['runs']} runs)"]
    failing = [r for r in rows if not r.ok]
    if failing:
        out += ["", f"{len(failing)} of {len(rows)} rows do not validate (gold must be FULL, empty NO):"]
        out += [f"  {r.instance_id} [{r.repo}]: {r.describe()}" for r in failing]
    else:
        out += ["", f"all {len(rows)} rows validate: gold FULL, empty NO"]
    return "\n".join(out)


def phase_times(timings: Iterable[dict[str, float]]) -> dict[str, Any]:
    """Median, p90 and slowest of each phase that sandbox verdicts timed (`Verdict.timings`: the wait for a slot
    `queued_s`, `checkout_s`, `apply_s`, `tests_s`, `grade_s`, and `total_s`, the run without the wait), each over
    the runs that went through it."""
    runs = 0
    phases: dict[str, list[float]] = defaultdict(list)
    for t in timings:
        runs += 1
        for name, seconds in t.items():
            phases[name].append(seconds)

    def spread(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {"median": statistics.median(xs), "p90": xs[min(len(xs) - 1, int(0.9 * len(xs)))], "max": xs[-1]}

    return {"runs": runs, "phases": {name: spread(xs) for name, xs in sorted(phases.items())}}


def run_times(rows: Sequence[RowCheck]) -> dict[str, Any]:
    """What one sandbox run costs on this host (`phase_times` over every run of `rows` that was timed; a remote
    executor's verdicts carry the same timings)."""
    return phase_times(v.timings for r in rows for v in (r.gold, r.empty) if v.timings)


def report_json(rows: Sequence[RowCheck], dataset: str, test_runner: dict[str, Any] | None = None) -> dict[str, Any]:
    def verdict(v: Verdict) -> dict[str, Any]:
        return {"kind": verdict_kind(v), "status": v.status, "resolution": v.resolution, "error": v.error[:2000],
                "tests_passed": v.tests_passed, "tests_failed": v.tests_failed, "timings": v.timings}

    return {
        "dataset": dataset, "ok": all(r.ok for r in rows), "repos": per_repo(rows), "total": _counts(rows),
        "run_times": run_times(rows), "test_runner": test_runner or {},
        "rows": [{"instance_id": r.instance_id, "repo": r.repo, "ok": r.ok, "gold": verdict(r.gold),
                  "empty": verdict(r.empty)} for r in rows],
    }


@dataclass(frozen=True)
class Validation:
    rows: list[RowCheck]
    test_runner: dict[str, str]
    """The versions the executor tested with (`Executor.test_runner`; an executor's /healthz when remote)."""


async def validate_tasks(tasks: Sequence[Task], cfg: MasterConfig, *, remote: bool, concurrency: int,
                         on_done: Callable[[RowCheck], None] | None = None) -> Validation:
    """Grade `tasks` on an in-process executor (`cfg.sandbox`), or with `remote` on the executors of
    `env.code.sandbox_urls` through the client the rollout workers use (its retries, its auth token)."""
    timeout_s = cfg.env.code.task_timeout
    if remote:
        from sandbox_client import SandboxClient

        async with SandboxClient.from_config(cfg.env.code, max_concurrency=concurrency) as client:
            async def run_remote(spec: TaskSpec) -> Verdict:
                result = await client.evaluate(spec)
                if result.infra_error is not None:
                    return Verdict(status="infra_error", error=result.infra_error)
                assert result.verdict is not None
                return result.verdict

            await client.health()
            rows = await check_rows(tasks, run_remote, concurrency=concurrency, timeout_s=timeout_s,
                                    on_done=on_done)
            versions = next((s.test_runner for s in client.pool.states if s.test_runner), {})
            return Validation(rows, dict(versions))
    from services.sandbox.executor import Executor

    # The executor's pool bounds what runs at once; the semaphore only keeps the queue from holding every row.
    sandbox = cfg.sandbox.model_copy(update={"pool_size": cfg.sandbox.pool_size or concurrency})
    async with Executor(sandbox) as ex:
        rows = await check_rows(tasks, ex.run, concurrency=concurrency, timeout_s=timeout_s, on_done=on_done)
        return Validation(rows, ex.test_runner)
