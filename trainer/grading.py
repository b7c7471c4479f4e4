"""No silent zeros: a step whose verdicts all failed to measure the answers says so, naming the repos.

A verdict the grader could not read (`not_gradable`: the tests ran but their log could not be graded) scores 0 like
a failed patch, and an unspecified one (`infra_error`: the wire's encoding of an infrastructure failure) is no verdict
at all. When every verdict of a step is one of these, the step's rewards are constant and its advantages zero: the
run looks like a policy that cannot learn while the harness is what is broken (a log parser that does not match the
image, a task set whose gold patches do not resolve: `grpo-fleet data validate --gold N` finds those). The grading
of each trajectory is structured data from the rollout worker (the verdict's `gradable`, `grading` below); nothing
here reads error text. `outcome` is the finer breakdown of a step's verdicts (`outcome/*`, trainer/batch.py).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Literal, get_args

from fleet.contracts.groups import ScoredGroup
from fleet.contracts.sandbox import Verdict

log = logging.getLogger(__name__)

Grading = Literal["graded", "not_gradable", "infra_error"]
"""Whether a trajectory's reward measured its answer: `graded`; `not_gradable` (the tests ran but their log could
not be graded: a silent zero); `infra_error` (no verdict the answer earned)."""
Outcome = Literal["full", "partial", "no", "format_error", "not_applied", "integrity", "timeout", "not_gradable",
                  "infra_error"]
"""The verdict in one word: full / partial / no (tests ran), format_error, not_applied, integrity, timeout,
not_gradable, infra_error."""
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)

_STATUS_OUTCOME: dict[str, Outcome] = {"format_error": "format_error", "not_applied": "not_applied",
                                       "refused": "integrity", "integrity_violation": "integrity",
                                       "timeout": "timeout"}
_RESOLUTION_OUTCOME: dict[str, Outcome] = {"FULL": "full", "PARTIAL": "partial"}


def grading(v: Verdict) -> Grading:
    """How far a trajectory's verdict measured the answer. `infra_error` is the wire's unspecified status: an
    infrastructure failure, or a status this trainer does not know."""
    if v.status == "infra_error":
        return "infra_error"
    return "not_gradable" if not v.gradable else "graded"


def outcome(v: Verdict) -> Outcome:
    """What the sandbox said of one answer, in one word (the `outcome/*` breakdown of a step)."""
    if v.status == "infra_error":
        return "infra_error"
    if not v.gradable:
        return "not_gradable"
    if v.status == "completed":
        return _RESOLUTION_OUTCOME.get(v.resolution, "no")
    return _STATUS_OUTCOME.get(v.status, "infra_error")

KINDS = {"not_gradable": "not gradable", "infra_error": "infra errors"}


def grading_stats(groups: Sequence[ScoredGroup]) -> dict[str, float]:
    """`verdicts/*` counts of the step: graded, not gradable, infra errors (they add up to the step's samples)."""
    kinds = Counter(grading(t.verdict) for g in groups for t in g.trajectories)
    return {"verdicts/graded": float(kinds["graded"]), "verdicts/not_gradable": float(kinds["not_gradable"]),
            "verdicts/infra_error": float(kinds["infra_error"])}


def ungraded_warning(step: int, groups: Sequence[ScoredGroup], repo_of: Callable[[str], str]) -> str | None:
    """The warning for a step none of whose verdicts measured the answer, or None. `repo_of(task_id)`: the task's
    repo (its task id when the source does not know it)."""
    trajs = [(g, t) for g in groups for t in g.trajectories]
    if not trajs or any(grading(t.verdict) == "graded" for _, t in trajs):
        return None
    kinds: Counter[str] = Counter(grading(t.verdict) for _, t in trajs)
    if len(kinds) == 1:
        what = KINDS[next(iter(kinds))]
    else:
        what = "not graded (" + ", ".join(f"{kinds[k]} {KINDS[k]}" for k in KINDS if kinds[k]) + ")"
    repos = Counter(repo_of(g.prompt.task_id) or g.prompt.task_id or g.prompt.group_id for g, _ in trajs)
    named = ", ".join(f"{repo} x{n}" for repo, n in repos.most_common())
    return (f"step {step}: all {len(trajs)} verdicts were {what} (repos: {named}) — the reward is not measuring "
            f"the policy")


def check_grading(step: int, groups: Sequence[ScoredGroup], repo_of: Callable[[str], str]) -> dict[str, float]:
    """Log the step's warning (once: the trainer calls this once per step) and return its `verdicts/*` metrics."""
    warning = ungraded_warning(step, groups, repo_of)
    if warning is not None:
        log.warning("%s", warning)
    return {**grading_stats(groups), "verdicts/all_ungraded": float(warning is not None)}
