"""The buffer's rules as pure functions: age bound, lease eligibility, starvation reasons, lease ids.

The Lua scripts (scripts.py) apply the same rules inside Redis, where they must run atomically; these functions are
their specification, unit-tested directly and checked against the scripts by the property tests.
"""

from __future__ import annotations

import re

# Versions: weight version k is the policy after k optimizer steps; step s trains with version s. A group generated
# with versions >= v (v = its oldest token's version) may train step s only if s - v <= max_age.


def effective_target(target_step: int, min_target_step: int, current_step: int) -> int:
    """The earliest step a queued group can train. BeginRun's floor re-targets groups of a resumed run without
    rewriting stream entries, and a group can never train before the step the trainer is at now."""
    return max(target_step, min_target_step, current_step)


def lease_eligible(target_step: int, min_target_step: int, current_step: int, version: int, max_age: int) -> bool:
    """A worker serving `version` may lease a group only if what it generates will still be young enough for the
    group's step: otherwise the work would be thrown away at sample time (back-pressure instead of waste)."""
    return effective_target(target_step, min_target_step, current_step) <= version + max_age


def within_age(step: int, min_version: int, max_age: int) -> bool:
    return step - min_version <= max_age


def starvation_reason(
    *,
    prompts_pending: int,
    leases_outstanding: int,
    live_workers: int,
    evicted_now: int,
) -> str:
    """Why a Sample answer came back short, most actionable cause first."""
    if prompts_pending == 0:
        return "evicted" if evicted_now else "no_prompts"
    if live_workers == 0:
        return "no_workers"
    if leases_outstanding > 0:
        return "generating"
    if evicted_now:
        return "evicted"
    return "workers_behind"


_LEASE_ID = re.compile(r"^(\d{1,20}-\d{1,20})@(\d{1,20})$")


def format_lease_id(entry_id: str, epoch: int) -> str:
    """A lease names the prompt-stream entry and the run epoch it was granted in (the epoch decides, at submit,
    whether the group's tokens can come from weights that a trainer resume discarded)."""
    return f"{entry_id}@{epoch}"


def parse_lease_id(lease_id: str) -> tuple[str, int]:
    """`(entry_id, epoch)`; ValueError when `lease_id` is not one this buffer could have granted."""
    m = _LEASE_ID.match(lease_id)
    if m is None:
        raise ValueError(f"malformed lease id {lease_id!r} (expected STREAMID@EPOCH, e.g. 1712345678901-0@3)")
    return m.group(1), int(m.group(2))
