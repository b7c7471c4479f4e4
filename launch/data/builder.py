"""`grpo-fleet data build`: sdists -> git repositories -> candidate bugs -> sandbox-validated SWE tasks.

Per repository: fetch and verify the sdist, commit it to a bare repo, run the whole test suite once on the clean
tree (the baseline), plan candidates (launch.data.candidates), validate them through the executor, keep the first
`max_per_repo` that pass. Repositories are processed concurrently and share the executor's pool.

Determinism: candidates are decided strictly in plan order (`select_in_order`), whatever order their sandbox runs
finish in, so the same recipe, seed and test outcomes give the same tasks for any `--workers`.
The set is written to a staging folder and moved into place at the end: a failed build never clobbers a good one.
One build at a time per output folder (an exclusive lock on `OUT/.build.lock`): `grpo-fleet up` building the default
set on first run and a `grpo-fleet data build` into the same folder would otherwise delete each other's repositories.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envs.registry import Task
from envs.swe.gitrepo import BareRepo
from envs.swe.paths import default_sdist_cache, repos_dir
from envs.swe.taskset import SPLITS, write_jsonl, write_manifest
from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import TaskSpec
from launch.data.candidates import Candidate, plan_candidates, test_files
from launch.data.mutations import BUG_KINDS
from launch.data.recipe import Recipe, RepoRecipe, load_recipe
from launch.data.sdist import extract_sdist, fetch_sdist
from launch.data.validate import TASK_REF, Baseline, Outcome, RepoValidator, Runner, run_with_retry

log = logging.getLogger(__name__)

RunnerFactory = Callable[[Path, "BuildOptions"], contextlib.AbstractAsyncContextManager[Runner]]
"""(repos_root, options) -> async context manager yielding `run(TaskSpec) -> Verdict`."""


class BuildError(RuntimeError):
    pass


@dataclass
class BuildOptions:
    out: Path
    repos: list[str] | None = None
    max_per_repo: int = 32
    seed: int = 0
    workers: int = 2
    cache_dir: Path = field(default_factory=default_sdist_cache)
    recipe_path: Path | None = None
    kinds: tuple[str, ...] = BUG_KINDS
    sandbox: SandboxConfig | None = None
    """Executor settings (bwrap, limits); `repos_root` and `pool_size` are set by the build."""
    if_missing: bool = False
    """Wait for another build of `out` instead of failing, and build only if no task set is there afterwards."""
    on_decided: Callable[[str, bool], None] | None = None
    """Called with (repository, accepted) for every candidate decided: progress for a bar."""
    max_seconds: float | None = None
    """Stop validating this many seconds after the build starts and write what was accepted by then (a window that
    ends, as on a lent GPU host). The set then depends on timing; the manifest names the repositories cut short."""


@dataclass
class RepoReport:
    name: str
    clean_commit: str = ""
    sdist_sha256: str = ""
    tests: int = 0
    tests_passing: int = 0
    candidates: int = 0
    validated: int = 0
    sandbox_runs: int = 0
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    rejections: list[dict[str, str]] = field(default_factory=list)
    """Every rejected candidate (function, kind, site, reason): what to look at when a repository yields little."""
    seconds: float = 0.0
    cut_short: bool = False
    """`max_seconds` ran out before `max_per_repo` tasks or the candidates did."""

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["rejected"] = dict(sorted(self.rejected.items()))
        out["seconds"] = round(self.seconds, 1)
        return out


@dataclass
class BuildReport:
    out: Path
    tasks: list[Task]
    repos: dict[str, RepoReport]
    seconds: float
    reused: bool = False
    """True when `if_missing` found a finished task set and nothing was built."""


@contextlib.contextmanager
def build_lock(out: Path, *, wait: bool) -> Iterator[None]:
    """Exclusive lock on `out/.build.lock` (released by the kernel if the process dies)."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / ".build.lock").open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            f.seek(0)
            raise BuildError(f"another build is writing {out} (pid {f.read().strip() or '?'}); wait for it or "
                             "choose another --out") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.asynccontextmanager
async def executor_runner(repos_root: Path, opts: BuildOptions) -> AsyncIterator[Runner]:
    """The real sandbox executor on `repos_root` (the code that grades rollouts validates the tasks)."""
    from services.sandbox.executor import Executor

    base = opts.sandbox or SandboxConfig()
    async with Executor(base.model_copy(update={"repos_root": str(repos_root), "pool_size": opts.workers})) as ex:
        yield ex.run


def _test_runner(run: Runner) -> dict[str, str]:
    """The versions the executor behind `run` tests with ({} for a stand-in runner that is not an executor's)."""
    return dict(getattr(getattr(run, "__self__", None), "test_runner", None) or {})


async def select_in_order(
    candidates: list[Candidate], validate: Callable[[Candidate], Coroutine[Any, Any, Outcome]], want: int,
    per_function: int, concurrency: int, on_decided: Callable[[Outcome], None] | None = None,
    deadline: float | None = None,
) -> list[Outcome]:
    """Outcomes of the candidates the sequential rule decides on, validated `concurrency` at a time.

    Sequential rule: walk the plan; skip a candidate whose function already has `per_function` accepted bugs;
    validate the others; stop at `want` accepted. Candidates run speculatively ahead of the decision point, and a
    result is only used once every earlier candidate is decided, so the answer never depends on timing, except
    through `deadline` (`time.monotonic()`): nothing is decided after it, and the candidates still running are
    cancelled.
    """
    decided: list[Outcome] = []
    pending: dict[int, asyncio.Task[Outcome]] = {}
    taken: Counter[str] = Counter()
    accepted = launch = commit = 0
    lookahead = 4 * concurrency + 8  # bounds the speculative work thrown away when the head candidate is slow
    try:
        while accepted < want and commit < len(candidates):
            if deadline is not None and time.monotonic() >= deadline:
                break
            running = sum(1 for t in pending.values() if not t.done())
            while running < concurrency and launch < len(candidates) and launch - commit < lookahead:
                c = candidates[launch]
                launch += 1
                # `taken` counts only decided acceptances: a lower bound, so skipping on it is always right.
                if taken[c.function_id] < per_function:
                    pending[c.order] = asyncio.create_task(validate(c))
                    running += 1
            while commit < launch and accepted < want:
                c = candidates[commit]
                task = pending.get(c.order)
                if task is None or taken[c.function_id] >= per_function:
                    if task is not None:
                        task.cancel()
                        del pending[c.order]
                    commit += 1
                    continue
                if not task.done():
                    break
                outcome = task.result()
                del pending[c.order]
                decided.append(outcome)
                if on_decided is not None:
                    on_decided(outcome)
                if outcome.task is not None:
                    taken[c.function_id] += 1
                    accepted += 1
                commit += 1
            running_tasks = [t for t in pending.values() if not t.done()]
            if running_tasks and accepted < want:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                await asyncio.wait(running_tasks, timeout=left, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in pending.values():
            task.cancel()
        await asyncio.gather(*pending.values(), return_exceptions=True)
    return decided


def _prepare_repo(r: RepoRecipe, cache: Path, work: Path, repos_root: Path) -> tuple[BareRepo, str, Path]:
    archive = fetch_sdist(r.package, r.version, r.sha256, cache)
    src = extract_sdist(archive, work / r.name)
    for v in r.vendor:
        vsrc = extract_sdist(fetch_sdist(v.package, v.version, v.sha256, cache), work / f"{r.name}.vendor.{v.package}")
        for source, dest in sorted(v.copy_map.items()):
            shutil.copytree(vsrc / source, src / dest)
    repo = BareRepo.create(repos_root / f"{r.name}.git")
    clean = repo.commit_directory(src, f"{r.package} {r.version}")
    repo.set_ref("refs/heads/main", clean)
    return repo, clean, src


async def _build_repo(r: RepoRecipe, recipe: Recipe, opts: BuildOptions, run: Runner, work: Path,
                      repos_root: Path, download: asyncio.Lock,
                      deadline: float | None = None) -> tuple[list[Task], RepoReport]:
    t0 = time.monotonic()
    report = RepoReport(r.name)
    async with download:
        for package, version, sha in [(r.package, r.version, r.sha256),
                                      *((v.package, v.version, v.sha256) for v in r.vendor)]:
            await asyncio.to_thread(fetch_sdist, package, version, sha, opts.cache_dir)
    repo, clean, src = await asyncio.to_thread(_prepare_repo, r, opts.cache_dir, work, repos_root)
    report.clean_commit, report.sdist_sha256 = clean, r.sha256
    all_tests = test_files(src, r)
    verdict = await run_with_retry(run, TaskSpec(repo_url=f"embedded://{r.name}", base_commit=clean, patch="",
                                                 test_command=r.test_command(recipe.pytest_args, all_tests),
                                                 timeout=600.0))
    if verdict.status != "completed" or not verdict.test_status:
        raise BuildError(f"{r.name}: the clean tree's test run did not complete ({verdict.status}: {verdict.error}); "
                         f"output tail:\n{verdict.stdout_tail[-1500:]}\n{verdict.stderr_tail[-1500:]}")
    # The sandbox's own test time, not our wall time: all repositories' baselines queue for the pool at once.
    baseline = Baseline(dict(verdict.test_status), float(verdict.timings.get("tests_s", 10.0)))
    report.tests, report.tests_passing = len(baseline.status), len(baseline.passing)
    candidates, modules = await asyncio.to_thread(plan_candidates, src, r, opts.seed, recipe.max_bugs_per_function,
                                                  opts.kinds, recipe.max_test_files)
    report.candidates = len(candidates)
    validator = RepoValidator(
        repo=repo, recipe=r, pytest_args=recipe.pytest_args, clean_commit=clean, baseline=baseline, run=run,
        modules=modules, max_fail_fraction=recipe.max_fail_fraction, validation_fraction=recipe.validation_fraction,
        # Bugs can still hang (recursion through generators, loops in callees). A candidate runs at most a few files
        # of the suite, so twice the whole clean suite's time is a wide margin; the 10 s floor covers a loaded host.
        timeout=min(60.0, max(10.0, 2 * baseline.seconds)),
        library_frames=recipe.statement_frames == "repository",
        extra_metadata={"recipe_version": recipe.recipe_version},
    )
    log.info("%s: %d tests (%d passing) on the clean tree in %.1fs; %d candidates", r.name, report.tests,
             report.tests_passing, baseline.seconds, len(candidates))
    progress = Counter[str]()

    def on_decided(o: Outcome) -> None:
        progress[o.reason] += 1
        if opts.on_decided is not None:
            opts.on_decided(r.name, o.task is not None)
        if sum(progress.values()) % 10 == 0:
            log.info("%s: %d/%d tasks after %d candidates (%s)", r.name, progress["accepted"], opts.max_per_repo,
                     sum(progress.values()), dict(progress))

    outcomes = await select_in_order(candidates, validator.validate, opts.max_per_repo, recipe.max_bugs_per_function,
                                     opts.workers, on_decided, deadline)
    tasks = [o.task for o in outcomes if o.task is not None]
    report.cut_short = deadline is not None and time.monotonic() >= deadline and len(tasks) < opts.max_per_repo \
        and len(outcomes) < len(candidates)
    report.validated, report.accepted = len(outcomes), len(tasks)
    report.sandbox_runs = 1 + sum(o.runs for o in outcomes)
    report.rejected = Counter(o.reason for o in outcomes if o.task is None)
    report.rejections = [{"function": o.candidate.function_id, "kind": o.candidate.kind,
                          "site": str(o.candidate.index), "reason": o.reason} for o in outcomes if o.task is None]
    if report.rejected["infra_error"] > max(2, report.validated // 10):
        # An executor that keeps failing says nothing about the bugs: stop instead of shipping a thinned-out set.
        errors = sorted({str(o.details.get("error", ""))[:200] for o in outcomes if o.reason == "infra_error"})
        raise BuildError(f"{r.name}: {report.rejected['infra_error']} sandbox infrastructure errors: {errors[:3]}")
    keep = {TASK_REF + t.instance_id for t in tasks}
    for ref in await asyncio.to_thread(repo.refs, TASK_REF):
        if ref not in keep:
            await asyncio.to_thread(repo.delete_ref, ref)
    # Only task commits stay reachable: the clean tree (the answer to every task) leaves the repository.
    await asyncio.to_thread(repo.delete_ref, "refs/heads/main")
    await asyncio.to_thread(repo.gc)
    report.seconds = time.monotonic() - t0
    log.info("%s: %d tasks from %d validated candidates in %.0fs (rejected: %s)", r.name, len(tasks),
             report.validated, report.seconds, dict(report.rejected))
    return tasks, report


async def build_taskset(opts: BuildOptions, make_runner: RunnerFactory = executor_runner) -> BuildReport:
    out = Path(opts.out)
    lock = build_lock(out, wait=opts.if_missing)
    await asyncio.to_thread(lock.__enter__)
    try:
        if opts.if_missing and (out / "train.jsonl").is_file():
            return BuildReport(out, [], {}, 0.0, reused=True)
        return await _build_locked(opts, make_runner, out)
    finally:
        lock.__exit__(None, None, None)


async def _build_locked(opts: BuildOptions, make_runner: RunnerFactory, out: Path) -> BuildReport:
    t0 = time.monotonic()
    recipe = load_recipe(opts.recipe_path)
    chosen = [recipe.repo(n) for n in opts.repos] if opts.repos else list(recipe.repos)
    staging = out / ".staging"
    work, repos_root = staging / "work", repos_dir(staging)
    await asyncio.to_thread(_fresh_staging, staging, work, repos_root)
    # pip is slow and CPU-hungry when several downloads prepare metadata at once: one download at a time (in recipe
    # order; asyncio.Lock is FIFO), while the repositories already fetched are being validated.
    download = asyncio.Lock()
    async with make_runner(repos_root.resolve(), opts) as run, asyncio.TaskGroup() as group:
        test_runner = _test_runner(run)
        # A TaskGroup: one repository failing cancels the others instead of leaving them running unobserved.
        deadline = t0 + opts.max_seconds if opts.max_seconds is not None else None
        jobs = [group.create_task(_build_repo(r, recipe, opts, run, work, repos_root, download, deadline))
                for r in chosen]
    results = [job.result() for job in jobs]
    shutil.rmtree(work)
    tasks = sorted((t for ts, _ in results for t in ts), key=lambda t: (t.repo, t.instance_id))
    reports = {rep.name: rep for _, rep in results}
    for split in SPLITS:
        write_jsonl(staging / f"{split}.jsonl", [t for t in tasks if t.split == split])
    seconds = time.monotonic() - t0
    write_manifest(staging, {
        "recipe_version": recipe.recipe_version, "recipe_fingerprint": recipe.fingerprint(), "seed": opts.seed,
        "max_per_repo": opts.max_per_repo, "kinds": list(opts.kinds), "workers": opts.workers,
        "tasks": len(tasks), "build_seconds": round(seconds, 1), "max_seconds": opts.max_seconds,
        "cut_short": sorted(n for n, r in reports.items() if r.cut_short),
        # The ids in FAIL_TO_PASS / PASS_TO_PASS are pytest's names under these versions (TrustedRunner.versions):
        # `data validate` and the fleet compare them with the executor's.
        "test_runner": test_runner,
        "repos": {n: r.to_json() for n, r in reports.items()},
    })
    _swap_into_place(staging, out)
    return BuildReport(out, tasks, reports, seconds)


def _fresh_staging(staging: Path, *folders: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)
    for folder in folders:
        folder.mkdir(parents=True)


def _swap_into_place(staging: Path, out: Path) -> None:
    for name in ("repos", *(f"{s}.jsonl" for s in SPLITS), "manifest.json"):
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
        (staging / name).rename(target)
    staging.rmdir()
