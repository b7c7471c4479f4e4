"""`Scorer.score` reports the infrastructure retries of its own scoring, also when scorings run concurrently."""

from __future__ import annotations

import asyncio

from fleet.config import load_config
from fleet.contracts.sandbox import TaskSpec, Verdict
from rollout.scoring import Scorer
from sandbox_client.results import SandboxResult

PATCH = "```diff\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n```\n"


class _OrderedSandbox:
    """Answers task `slow` only after task `fast` has answered, with a set number of attempts per task."""

    def __init__(self, attempts: dict[str, int]) -> None:
        self.attempts = attempts
        self.fast_done = asyncio.Event()

    async def evaluate(self, spec: TaskSpec) -> SandboxResult:
        if spec.repo_url == "slow":
            await self.fast_done.wait()
        verdict = Verdict(status="completed", patch_applied=True, resolution="FULL")
        result = SandboxResult(verdict, attempts=self.attempts[spec.repo_url])
        if spec.repo_url == "fast":
            self.fast_done.set()
        return result

    async def close(self) -> None:
        pass


def _payload(repo: str) -> dict[str, object]:
    return {"instance_id": repo, "repo_url": repo, "base_commit": "0" * 40, "test_patch": "",
            "fail_to_pass": [], "pass_to_pass": [], "test_command": "true"}


async def test_concurrent_scorings_each_report_their_own_retries() -> None:
    scorer = Scorer(load_config("examples/configs/grpo_swe_tiny.yaml").env)
    await scorer.close()
    scorer.sandbox = _OrderedSandbox({"slow": 1, "fast": 4})  # type: ignore[assignment]
    slow = asyncio.create_task(scorer.score("swe", _payload("slow"), PATCH, truncated=False))
    fast = asyncio.create_task(scorer.score("swe", _payload("fast"), PATCH, truncated=False))
    (_, reward_slow, retries_slow), (_, _, retries_fast) = await asyncio.gather(slow, fast)
    # The slow scoring's window spans the fast one's 3 retries; they are not its own.
    assert (retries_slow, retries_fast) == (0, 3)
    assert scorer.infra_retries == 3
    assert reward_slow == 1.0


def test_integrity_violation_pays_the_configured_reward_in_either_mode() -> None:
    from fleet.config import parse_config
    from rollout.scoring import reward_for

    cfg = parse_config({"env": {"code": {"integrity_violation_reward": -3.0}}})
    assert reward_for(cfg.env, "swe", Verdict(status="integrity_violation", patch_applied=True)) == -3.0


class _PullRecorder:
    def __init__(self) -> None:
        self.pulled: list[str] = []

    async def prefetch(self, image: str) -> int:
        self.pulled.append(image)
        return 1

    async def close(self) -> None:
        pass


async def test_prefetch_asks_the_executors_for_an_image_task_only() -> None:
    scorer = Scorer(load_config("examples/configs/grpo_swe_tiny.yaml").env)
    await scorer.close()
    scorer.sandbox = recorder = _PullRecorder()  # type: ignore[assignment]
    await scorer.prefetch({**_payload("a"), "image": "localhost:5000/sweb.eval.x86_64.calc:latest"})
    await scorer.prefetch(_payload("b"))
    assert recorder.pulled == ["localhost:5000/sweb.eval.x86_64.calc:latest"]


class _BlockingSandbox:
    """Grades every spec FULL once `release` is set, counting the runs."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.runs = 0

    async def evaluate(self, spec: TaskSpec) -> SandboxResult:
        self.runs += 1
        await self.release.wait()
        return SandboxResult(Verdict(status="completed", patch_applied=True, resolution="FULL"), attempts=1)

    async def close(self) -> None:
        pass


async def test_an_answer_waiting_on_a_cancelled_identical_run_grades_itself() -> None:
    """Identical answers in flight share one run; if the scoring that owns it is cancelled (its group was given
    back), the one waiting on it runs the spec itself instead of failing."""
    scorer = Scorer(load_config("examples/configs/grpo_swe_tiny.yaml").env)
    await scorer.close()
    scorer.sandbox = sandbox = _BlockingSandbox()  # type: ignore[assignment]
    owner = asyncio.create_task(scorer.score("swe", _payload("a"), PATCH, truncated=False))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(scorer.score("swe", _payload("a"), PATCH, truncated=False))
    await asyncio.sleep(0.01)
    assert sandbox.runs == 1
    owner.cancel()
    await asyncio.sleep(0.01)
    sandbox.release.set()
    verdict, reward, _ = await waiter
    assert (verdict.resolution, reward, sandbox.runs) == ("FULL", 1.0, 2)
    assert owner.cancelled()
