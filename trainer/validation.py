"""Validation rounds: the first `grpo.max_val_samples` tasks of the validation split, one generation each at
`grpo.val_temperature` (greedy by default), scored like training answers and never trained.

A round reports `val/accuracy` = FULL resolutions / graded tasks, and the verdict of every task it asked for
(`val/verdict/<kind>`, counts that add up to `val/tasks`; per task in the run's `validation_tasks.jsonl`, so that
two rounds can be compared task by task, with each verdict's error and the first `logger.val_answers_logged`
answers): resolved, tests failed, patch did not apply, no patch,
timeout, integrity refused, infrastructure error. Infrastructure failures never become verdicts (the worker retries
them, then gives the lease back, and the buffer dead-letters a group after `replay_buffer.max_deliveries` leases):
a task that is not back within `grpo.val_timeout_s` is counted as an infrastructure error and left out of the
accuracy, so a sandbox outage does not read as a model that got worse.

The coordinator calls `run_validation` with the parts it reads (the bridge into the control-plane loop, the buffer
client, the validation split, `grpo`, the stop flag), never the coordinator itself. The verdicts are the shared
contract's (`fleet.contracts.sandbox.Verdict`, as the buffer client hands them over), classified here into the
breakdown's buckets.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from buffer_client import BufferClient
from fleet.config.algorithm import GrpoConfig
from fleet.contracts.groups import ScoredGroup, Trajectory
from fleet.contracts.sandbox import Verdict
from trainer.batch import answer_times
from trainer.data import TaskSource, validation_groups

T = TypeVar("T")


class Call(Protocol):
    """Runs a coroutine on the control-plane loop and waits for it (`Coordinator.call`)."""

    def __call__(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T: ...


log = logging.getLogger(__name__)

# Metric suffix -> how `grpo-fleet status` names it. Every task of a round gets exactly one of these.
VERDICT_KINDS: dict[str, str] = {
    "resolved": "resolved",
    "tests_failed": "tests failed",
    "patch_not_applied": "patch did not apply",
    "no_patch": "no patch",
    "timeout": "timeout",
    "integrity_refused": "integrity refused",
    "infra_error": "infrastructure error",
}

_BY_STATUS = {
    "format_error": "no_patch",
    "not_applied": "patch_not_applied",
    "refused": "integrity_refused",
    # A cheat caught while the tests ran (issue 16) is graded like one refused before: not infrastructure.
    "integrity_violation": "integrity_refused",
    "timeout": "timeout",
}


def verdict_kind(verdict: Verdict) -> str:
    """The breakdown bucket of one verdict. Tests that ran count as resolved only on a FULL resolution (all of
    FAIL_TO_PASS and PASS_TO_PASS pass); `infra_error` (the wire's unspecified status) is no verdict the model
    earned."""
    if verdict.status == "completed":
        return "resolved" if verdict.resolution == "FULL" else "tests_failed"
    return _BY_STATUS.get(verdict.status, "infra_error")


def summarize(trajectories: list[Trajectory], tasks: int) -> dict[str, float]:
    """A round's metrics from the trajectories that came back; the `tasks - len(trajectories)` missing ones are
    infrastructure errors."""
    kinds = Counter(verdict_kind(t.verdict) for t in trajectories)
    kinds["infra_error"] += max(0, tasks - len(trajectories))
    graded = tasks - kinds["infra_error"]
    out = {f"val/verdict/{k}": float(kinds[k]) for k in VERDICT_KINDS}
    out.update({"val/tasks": float(tasks), "val/graded": float(graded)})
    if graded > 0:
        out["val/accuracy"] = kinds["resolved"] / graded
        out["val/reward_mean"] = sum(t.reward for t in trajectories) / max(1, len(trajectories))
    if kinds["infra_error"]:
        out["val/incomplete"] = 1.0
    out.update(answer_times(trajectories, "val"))  # where a round's time goes: the engine, or the sandbox
    return out


_MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class ValidationRound:
    metrics: dict[str, float]
    verdicts: dict[str, str] = field(default_factory=dict)
    """task id -> its verdict bucket (`VERDICT_KINDS`): what a paired comparison of two rounds needs."""
    errors: dict[str, str] = field(default_factory=dict)
    """task id -> the verdict's error (why a patch did not apply, was refused...), where there is one."""
    answers: dict[str, list[int]] = field(default_factory=dict)
    """task id -> the answer's token ids, for the first `logger.val_answers_logged` tasks of the round."""


def run_validation(call: Call, buffer: BufferClient, source: TaskSource, g: GrpoConfig, step: int,
                   stop_requested: Callable[[], bool], answers_logged: int = 0) -> ValidationRound:
    """Enqueue a round for `step` from `source`, wait for it (at most `grpo.val_timeout_s`), and summarise it."""
    t0 = time.monotonic()
    prompts = validation_groups(source, step, g.max_val_samples)
    call(buffer.enqueue(prompts))
    wanted = {p.group_id for p in prompts}
    timeout_s = g.val_timeout_s if g.val_timeout_s is not None else g.sample_timeout_s
    got: dict[str, ScoredGroup] = {}
    last_log = 0.0
    while len(got) < len(wanted) and time.monotonic() - t0 < timeout_s:
        if stop_requested():
            raise InterruptedError("stop requested while validating")
        deadline = min(g.sample_deadline_s, max(0.1, timeout_s - (time.monotonic() - t0)))
        groups, starving = call(_sample(buffer, step, len(wanted) - len(got), deadline))
        for group in groups:
            if group.prompt.group_id in wanted:
                got[group.prompt.group_id] = group
            else:  # scored after an earlier round had given up on it: it says nothing about these weights
                log.info("validation at step %d: dropping %s, left over from an earlier round", step,
                         group.prompt.group_id)
        if len(got) < len(wanted) and starving and time.monotonic() - last_log >= 10.0:
            log.info("validation at step %d waiting (%d/%d tasks): %s", step, len(got), len(wanted), starving)
            last_log = time.monotonic()
    if len(got) < len(wanted):
        log.error("validation at step %d: %d of %d tasks not back after %.0f s (grpo.val_timeout_s); counted as "
                  "infrastructure errors", step, len(wanted) - len(got), len(wanted), timeout_s)
    trajectories = [t for group in got.values() for t in group.trajectories[:1]]
    verdicts = {p.task_id: "infra_error" for p in prompts}
    errors: dict[str, str] = {}
    answers: dict[str, list[int]] = {}
    logged = {p.task_id for p in prompts[:answers_logged]}
    for group in got.values():
        for t in group.trajectories[:1]:
            task = group.prompt.task_id
            verdicts[task] = verdict_kind(t.verdict)
            if t.verdict.error:
                errors[task] = t.verdict.error[:_MAX_ERROR_CHARS]
            if task in logged:
                answers[task] = list(t.response_token_ids)
    metrics = {**summarize(trajectories, len(wanted)), "val/step": float(step),
               "timing/validation_s": time.monotonic() - t0}
    return ValidationRound(metrics, verdicts, errors, answers)


async def _sample(buffer: BufferClient, step: int, num_groups: int,
                  deadline_s: float) -> tuple[list[ScoredGroup], str]:
    """One validation Sample through the buffer client's retrying call; (scored groups, starvation reason)."""
    groups, starvation = await buffer.sample(step, num_groups, deadline_s, min_groups=1, validation=True)
    return groups, starvation.reason
