"""Validation of one candidate bug, entirely through the sandbox executor (the same code that grades rollouts).

A candidate becomes a task only if, on the tests that exercise its function:
  1. the buggy tree (empty patch) still collects every test that the clean tree ran -- no import/collection break;
  2. at least one test that passes on the clean tree fails (FAIL_TO_PASS), and not more than `max_fail_fraction`;
  3. the gold patch (the reverse diff) resolves FULL: all FAIL_TO_PASS and PASS_TO_PASS pass again.
The empty-patch run of step 1 is also the proof that doing nothing does not resolve the task.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from envs.registry import Task
from envs.swe.gitrepo import BareRepo
from fleet.contracts.sandbox import TaskSpec, Verdict
from launch.data.candidates import Candidate
from launch.data.mutations import ModuleSites
from launch.data.recipe import RepoRecipe
from launch.data.statement import write_statement

log = logging.getLogger(__name__)

Runner = Callable[[TaskSpec], Awaitable[Verdict]]
PASSING = frozenset({"PASSED", "XFAIL"})
TASK_REF = "refs/heads/task/"


def test_file_of(test_id: str) -> str:
    """`tests/test_x.py::TestA::test_b[p]` -> `tests/test_x.py`."""
    return test_id.split("::", 1)[0]


def is_passing(status: str) -> bool:
    return status.upper() in PASSING


def function_split(repo: str, function_id: str, validation_fraction: float) -> str:
    """Split by function, not by row: every bug of one function lands in the same split, whatever the seed."""
    h = int(hashlib.sha256(f"{repo}:{function_id}".encode()).hexdigest()[:8], 16) / 0x1_0000_0000
    return "validation" if h < validation_fraction else "train"


def task_split(recipe: RepoRecipe, function_id: str, validation_fraction: float) -> str:
    """The repository's own split when the recipe names one (a held-out repository), else `function_split`."""
    return recipe.split or function_split(recipe.name, function_id, validation_fraction)


@dataclass
class Baseline:
    """The clean tree's test run: which tests exist and which pass."""

    status: dict[str, str]
    seconds: float

    @property
    def passing(self) -> set[str]:
        return {t for t, s in self.status.items() if is_passing(s)}


@dataclass
class Outcome:
    candidate: Candidate
    reason: str
    """`accepted`, or why not: no_change, collection, no_failure, too_broad, timeout, gold_not_full, infra_error..."""
    task: Task | None = None
    runs: int = 0
    seconds: float = 0.0
    details: dict[str, object] = field(default_factory=dict)


async def run_with_retry(run: Runner, spec: TaskSpec, retries: int = 1) -> Verdict:
    """Infrastructure failures are retried: they say nothing about the candidate."""
    verdict = await run(spec)
    for _ in range(retries):
        if not verdict.is_infra_failure:
            break
        log.warning("sandbox infra error (%s); retrying", verdict.error[:200])
        verdict = await run(spec)
    return verdict


# Wall-clock limits follow the host's load: a candidate that runs slow but ends (a host shared with a GPU's processes,
# or with a second build) timed out in one build and was accepted in another of the same recipe and seed (a CI run
# of tests/integration/launch/test_taskset_build.py, 2026-12-06). A timeout is retried once at this many times the
# limit before the candidate is called a hang: a real hang still ends as one, at 1 + this many times its cost.
TIMEOUT_RETRY_FACTOR = 3.0


async def run_candidate(run: Runner, spec: TaskSpec) -> Verdict:
    """`run_with_retry`, and a timeout once more with `TIMEOUT_RETRY_FACTOR` times the limit."""
    verdict = await run_with_retry(run, spec)
    if verdict.status == "timeout":
        log.info("a run timed out at %.0f s; once more at %.0f s", spec.timeout, spec.timeout * TIMEOUT_RETRY_FACTOR)
        verdict = await run_with_retry(run, replace(spec, timeout=spec.timeout * TIMEOUT_RETRY_FACTOR))
    return verdict


@dataclass
class RepoValidator:
    repo: BareRepo
    recipe: RepoRecipe
    pytest_args: list[str]
    clean_commit: str
    baseline: Baseline
    run: Runner
    modules: dict[str, ModuleSites]
    max_fail_fraction: float
    validation_fraction: float
    timeout: float
    library_frames: bool = False
    extra_metadata: dict[str, object] = field(default_factory=dict)

    @property
    def repo_url(self) -> str:
        return f"embedded://{self.recipe.name}"

    def _spec(self, commit: str, patch: str, command: str, f2p: list[str] | None = None,
              p2p: list[str] | None = None) -> TaskSpec:
        return TaskSpec(repo_url=self.repo_url, base_commit=commit, patch=patch, test_command=command,
                        fail_to_pass=f2p or [], pass_to_pass=p2p or [], timeout=self.timeout)

    async def validate(self, c: Candidate) -> Outcome:
        t0 = time.monotonic()
        outcome = await self._validate(c)
        outcome.seconds = time.monotonic() - t0
        return outcome

    async def _validate(self, c: Candidate) -> Outcome:
        # LibCST and git are CPU/process work: off the event loop so sandbox results keep flowing.
        new_code = await asyncio.to_thread(self.modules[c.file].mutate, c.qualname, c.kind, c.index)
        if new_code is None:
            return Outcome(c, "no_change")
        bug_commit = await asyncio.to_thread(
            self.repo.commit_replacing, self.clean_commit, {c.file: new_code},
            f"{self.recipe.package} {self.recipe.version}")
        gold = await asyncio.to_thread(self.repo.diff, bug_commit, self.clean_commit)
        iid = f"{self.recipe.name}__{c.kind}__{hashlib.sha256(gold.encode()).hexdigest()[:10]}"
        # The executor materialises base_commit from the bare repo: it must be reachable from a ref.
        await asyncio.to_thread(self.repo.set_ref, TASK_REF + iid, bug_commit)
        command = self.recipe.test_command(self.pytest_args, list(c.test_files))
        expected = {t for t in self.baseline.status if test_file_of(t) in c.test_files}
        expected_pass = sorted(t for t in expected if is_passing(self.baseline.status[t]))

        empty = await run_candidate(self.run, self._spec(bug_commit, "", command))
        if empty.status != "completed":
            return Outcome(c, "timeout" if empty.status == "timeout" else empty.status, runs=1,
                           details={"error": empty.error[:300]})
        missing = expected - set(empty.test_status)
        if missing or not expected:
            return Outcome(c, "collection", runs=1, details={"missing": len(missing)})
        f2p = [t for t in expected_pass if not is_passing(empty.test_status[t])]
        p2p = [t for t in expected_pass if is_passing(empty.test_status[t])]
        if not f2p:
            return Outcome(c, "no_failure", runs=1)
        if len(f2p) > self.max_fail_fraction * len(expected_pass):
            return Outcome(c, "too_broad", runs=1, details={"f2p": len(f2p), "of": len(expected_pass)})

        fixed = await run_candidate(self.run, self._spec(bug_commit, gold, command, f2p, p2p))
        if fixed.status != "completed" or fixed.resolution != "FULL":
            return Outcome(c, "gold_not_full", runs=2,
                           details={"status": fixed.status, "resolution": fixed.resolution, "error": fixed.error[:300]})
        test_paths = tuple(self.recipe.tests)
        statement = write_statement(iid, self.recipe.package, self.recipe.version, f2p,
                                    empty.stdout_tail + "\n" + empty.stderr_tail, test_paths,
                                    library_frames=self.library_frames)
        split = task_split(self.recipe, c.function_id, self.validation_fraction)
        task = Task(
            instance_id=iid, env_name="swe", problem_statement=statement, repo=self.recipe.name,
            repo_url=self.repo_url, base_commit=bug_commit, patch=gold, test_patch="", fail_to_pass=tuple(f2p),
            pass_to_pass=tuple(p2p), version=self.recipe.version, test_command=command, split=split,
            metadata={"bug_kind": c.kind, "function": c.qualname, "file": c.file, "test_files": list(c.test_files),
                      "package": self.recipe.package, "hints_text": "", "created_at": "2000-01-01T00:00:00Z",
                      "environment_setup_commit": bug_commit, **self.extra_metadata},
        )
        return Outcome(c, "accepted", task=task, runs=2)
