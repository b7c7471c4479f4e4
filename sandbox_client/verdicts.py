"""What a verdict says about the reward, beyond its status: whether the eval log could be graded at all.

A verdict of tests that ran but whose log the grader could not read (no markers, an error marker, an exit code that
contradicts the log) is `completed` with resolution NO, exactly like a patch that failed its tests. Its reward of 0 is
a silent zero: it measures the harness, not the patch. The sandbox's grader (`services/sandbox/images/contract.py`,
`grade()`) sets `Verdict.gradable` (and says why in `error`, NOT_GRADABLE_NOTE); the buffer client's wire
(`buffer_client/wire.py`) carries it to the trainer as the proto's `Verdict.not_gradable`.
"""

from __future__ import annotations

from fleet.contracts.sandbox import Verdict

NOT_GRADABLE_NOTE = "eval log not gradable"
"""How `grade()` says so in `Verdict.error`, for people reading logs (code reads `Verdict.gradable`)."""


def is_not_gradable(verdict: Verdict) -> bool:
    """The tests ran to the end but their log could not be graded: resolution NO says nothing about the patch. (A
    timeout's log is cut short by the kill; it stays a timeout.)"""
    return verdict.status == "completed" and not verdict.gradable
