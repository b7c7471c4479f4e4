"""`env.code.verdict_cache_size`: the rollout worker's scorer (`rollout/scoring.py`) against a real executor over
HTTP. Answers whose patch another answer already sent are graded from the worker's cache, identical answers in
flight share one run, and only verdicts about the patch are kept."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from sandbox_helpers import CalcRepo

from fleet.config import parse_config
from rollout.scoring import Scorer
from services.sandbox.runlog import read_run_log
from services.sandbox.server import SandboxServer


def _payload(repo: CalcRepo) -> dict[str, Any]:
    """The payload of a SWE prompt group (`envs/swe/payload.py`), for the calc repository's task."""
    spec = repo.spec("")
    return {"instance_id": "calc__1", "repo_url": spec.repo_url, "base_commit": spec.base_commit,
            "test_patch": spec.test_patch, "fail_to_pass": spec.fail_to_pass, "pass_to_pass": spec.pass_to_pass,
            "test_command": None}


def _scorer(server: SandboxServer, cache: int, task_timeout: float = 60.0) -> Scorer:
    return Scorer(parse_config({"env": {"code": {
        "sandbox_urls": [f"http://127.0.0.1:{server.port}"], "reward_mode": "binary", "task_timeout": task_timeout,
        "verdict_cache_size": cache}}}).env)


def _answer(patch: str) -> str:
    return f"The fix:\n```diff\n{patch}```\n"


async def test_identical_answers_are_graded_once_and_get_the_same_verdict(
        server: SandboxServer, calc_repo: CalcRepo, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="services.sandbox.executor")
    scorer = _scorer(server, cache=64)
    broken = calc_repo.diff({"calc/core.py": "def neg(x):\n    return 0\n"})
    try:
        # A group's answers are scored concurrently: four copies of the gold patch and one other answer.
        group = [calc_repo.gold] * 4 + [broken]
        results = await asyncio.gather(*(scorer.score("swe", _payload(calc_repo), _answer(p), truncated=False)
                                         for p in group))
        assert [r[0].resolution for r in results] == ["FULL"] * 4 + ["NO"]
        assert [r[1] for r in results] == [1.0] * 4 + [0.0]
        assert len(read_run_log(caplog.text)) == 2
        # A later step's identical answer: from the cache, a copy of the same verdict.
        verdict, reward, _ = await scorer.score("swe", _payload(calc_repo), _answer(calc_repo.gold), truncated=False)
        assert (verdict.resolution, reward) == ("FULL", 1.0) and verdict is not results[0][0]
        assert len(read_run_log(caplog.text)) == 2
        assert scorer.verdicts is not None and scorer.verdicts.stats() == {"hits": 4, "misses": 2, "kept": 2}
    finally:
        await scorer.close()


async def test_a_timeout_is_graded_again_and_a_cache_of_zero_runs_every_answer(
        server: SandboxServer, calc_repo: CalcRepo, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="services.sandbox.executor")
    # A patch whose import sleeps past the task's timeout: the executor's load, not the patch alone, decides that.
    sleepy = calc_repo.diff({"calc/core.py": "import time\ntime.sleep(30)\n\ndef neg(x):\n    return -x\n"})
    scorer = _scorer(server, cache=64, task_timeout=3.0)
    off = _scorer(server, cache=0)
    try:
        for _ in range(2):
            verdict, _, _ = await scorer.score("swe", _payload(calc_repo), _answer(sleepy), truncated=False)
            assert verdict.status == "timeout"
        assert scorer.verdicts is not None and scorer.verdicts.stats()["kept"] == 0
        assert off.verdicts is None
        for _ in range(2):
            verdict, _, _ = await off.score("swe", _payload(calc_repo), _answer(calc_repo.gold), truncated=False)
            assert verdict.resolution == "FULL"
        assert [status for status, _ in read_run_log(caplog.text)] == ["timeout", "timeout", "completed",
                                                                      "completed"]
    finally:
        await scorer.close()
        await off.close()
