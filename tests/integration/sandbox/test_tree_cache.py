"""`sandbox.tree_cache_size`: the executor grades a tree once. Answers whose diffs differ but leave the same files
(other context lines, other hunk offsets) get the first one's verdict without running the tests again; any other
tree, or the same tree under other tests, runs. On the real executor (bwrap, the trusted runner)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sandbox_helpers import CORE, F2P, ONE_LINE_CONTEXT, CalcRepo

from fleet.config.infra import SandboxConfig
from services.sandbox.executor import Executor

# The same lines with the first hunk's context line wrong: `patch` applies it with fuzz and keeps a backup of the
# file it fuzzed (`calc/core.py.orig`, as SWE-bench's harness would leave it): another tree.
FUZZED = ONE_LINE_CONTEXT.replace(" def add(a, b):", " def neg(x):")


@pytest.fixture
async def cached(sandbox_cfg: SandboxConfig) -> AsyncIterator[Executor]:
    async with Executor(sandbox_cfg.model_copy(update={"tree_cache_size": 8})) as ex:
        yield ex


async def test_a_diff_spelt_otherwise_that_leaves_the_same_tree_is_graded_from_the_cache(
        cached: Executor, calc_repo: CalcRepo) -> None:
    assert ONE_LINE_CONTEXT != calc_repo.gold
    first = await cached.run(calc_repo.spec(calc_repo.gold))
    again = await cached.run(calc_repo.spec(ONE_LINE_CONTEXT))
    assert (first.status, first.resolution) == (again.status, again.resolution) == ("completed", "FULL")
    assert again.test_status == first.test_status and again.report == first.report
    assert "tests_s" in first.timings and "tests_s" not in again.timings and "tree_key_s" in again.timings
    assert cached.trees is not None and cached.trees.stats() == {"hits": 1, "misses": 1, "kept": 1}
    assert cached.health()["tree_cache"] == {"hits": 1, "misses": 1, "kept": 1}


async def test_another_tree_or_other_tests_run_again(cached: Executor, calc_repo: CalcRepo) -> None:
    half = calc_repo.diff({"calc/core.py": CORE.replace("return a - b", "return a + b")})  # add fixed, mul not
    v_gold = await cached.run(calc_repo.spec(calc_repo.gold))
    v_half = await cached.run(calc_repo.spec(half))
    v_fewer = await cached.run(calc_repo.spec(calc_repo.gold, fail_to_pass=F2P[:1]))
    v_fuzzed = await cached.run(calc_repo.spec(FUZZED))
    assert v_gold.resolution == v_fewer.resolution == v_fuzzed.resolution == "FULL" and v_half.resolution != "FULL"
    assert all("tests_s" in v.timings for v in (v_gold, v_half, v_fewer, v_fuzzed))
    assert cached.trees is not None and cached.trees.stats() == {"hits": 0, "misses": 4, "kept": 4}


async def test_identical_trees_in_flight_share_one_run(cached: Executor, calc_repo: CalcRepo) -> None:
    a, b = await asyncio.gather(cached.run(calc_repo.spec(calc_repo.gold)),
                                cached.run(calc_repo.spec(ONE_LINE_CONTEXT)))
    assert a.resolution == b.resolution == "FULL"
    assert sum("tests_s" in v.timings for v in (a, b)) == 1
    assert cached.trees is not None and cached.trees.stats()["hits"] == 1


async def test_a_timeout_is_not_kept(cached: Executor, calc_repo: CalcRepo) -> None:
    spin = calc_repo.diff({"calc/core.py": CORE.replace("return a - b", "while True:\n        pass")})
    spec = calc_repo.spec(spin, timeout=3.0)
    first = await cached.run(spec)
    again = await cached.run(dataclasses.replace(spec))
    assert first.status == again.status == "timeout"
    assert cached.trees is not None and cached.trees.stats() == {"hits": 0, "misses": 2, "kept": 0}


async def test_off_by_default_every_run_counts(executor: Executor, calc_repo: CalcRepo) -> None:
    runs = [await executor.run(calc_repo.spec(p)) for p in (calc_repo.gold, ONE_LINE_CONTEXT)]
    assert all(v.resolution == "FULL" and "tests_s" in v.timings for v in runs)
    assert executor.trees is None and executor.health()["tree_cache"] is None


async def test_a_restarted_executor_answers_from_the_cache_file_of_its_own_environment(
        sandbox_cfg: SandboxConfig, calc_repo: CalcRepo, tmp_path: Path) -> None:
    cfg = sandbox_cfg.model_copy(update={"tree_cache_size": 8, "tree_cache_path": str(tmp_path / "trees.jsonl")})
    async with Executor(cfg) as first:
        graded = await first.run(calc_repo.spec(calc_repo.gold))
    assert len((tmp_path / "trees.jsonl").read_text().splitlines()) == 1
    async with Executor(cfg) as restarted:
        again = await restarted.run(calc_repo.spec(ONE_LINE_CONTEXT))
        assert restarted.trees is not None and restarted.trees.stats() == {"hits": 1, "misses": 0, "kept": 1,
                                                                           "loaded": 1}
    assert (again.status, again.resolution, again.test_status) == ("completed", "FULL", graded.test_status)
    assert "tests_s" not in again.timings
    # Another memory limit can change a verdict: that executor grades the tree itself.
    async with Executor(cfg.model_copy(update={"memory_mb": cfg.memory_mb + 512})) as other:
        rerun = await other.run(calc_repo.spec(ONE_LINE_CONTEXT))
        assert other.trees is not None and other.trees.stats()["loaded"] == 0
    assert rerun.resolution == "FULL" and "tests_s" in rerun.timings
