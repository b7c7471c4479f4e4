"""A candidate's run that times out is run once more with a longer limit before the candidate is called a hang
(`launch/data/validate.py` `run_candidate`): wall-clock limits follow the host's load, and the same recipe and seed
must give the same tasks on a loaded host. The runner here stands in for the executor and answers by the limit it is
given, so what is checked is the policy: which limits are asked for, and which verdict is kept."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fleet.contracts.sandbox import TaskSpec, Verdict
from launch.data.validate import TIMEOUT_RETRY_FACTOR, run_candidate

SPEC = TaskSpec(repo_url="embedded://inflection", base_commit="c0ffee", patch="", timeout=10.0)


def runner(needs_s: float, limits: list[float]) -> Callable[[TaskSpec], Awaitable[Verdict]]:
    """A run that needs `needs_s` seconds: a timeout under a shorter limit; infra errors never."""

    async def run(spec: TaskSpec) -> Verdict:
        limits.append(spec.timeout)
        return Verdict(status="completed" if spec.timeout >= needs_s else "timeout")

    return run


async def test_a_slow_run_that_times_out_is_accepted_at_the_longer_limit() -> None:
    limits: list[float] = []
    verdict = await run_candidate(runner(25.0, limits), SPEC)
    assert verdict.status == "completed"
    assert limits == [10.0, 10.0 * TIMEOUT_RETRY_FACTOR]


async def test_a_hang_still_ends_as_a_timeout_after_one_longer_run() -> None:
    limits: list[float] = []
    verdict = await run_candidate(runner(float("inf"), limits), SPEC)
    assert verdict.status == "timeout"
    assert limits == [10.0, 10.0 * TIMEOUT_RETRY_FACTOR]


async def test_a_run_within_its_limit_runs_once() -> None:
    limits: list[float] = []
    assert (await run_candidate(runner(1.0, limits), SPEC)).status == "completed"
    assert limits == [10.0]
