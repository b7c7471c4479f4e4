"""The speedrun's held-out comparison (`report.heldout_changes`): rounds compared task by task, a paired
bootstrap interval, and tasks with an infrastructure error in either round left out of the pair."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import report  # noqa: E402


def round_(step: int, kinds: list[str]) -> dict[str, object]:
    return {"step": step, "verdicts": {f"t{i}": k for i, k in enumerate(kinds)}}


def test_a_change_is_measured_on_the_same_tasks_with_an_interval_around_it() -> None:
    before = round_(0, ["no_patch"] * 90 + ["resolved"] * 10)
    after = round_(20, ["resolved"] * 30 + ["no_patch"] * 60 + ["resolved"] * 10)
    first, second = report.heldout_changes([before, after])
    assert first == {"step": 0, "tasks": 100, "resolved": 10, "change": 0.0, "change_ci95": [0.0, 0.0]}
    assert second["resolved"] == 40 and abs(second["change"] - 0.30) < 1e-9
    lo, hi = second["change_ci95"]
    assert 0.15 < lo < 0.30 < hi < 0.45


def test_tasks_lost_to_infrastructure_in_either_round_leave_the_pair() -> None:
    before = round_(0, ["infra_error", "no_patch", "no_patch", "resolved"])
    after = round_(5, ["resolved", "resolved", "infra_error", "resolved"])
    (_, second) = report.heldout_changes([before, after])
    assert second["tasks"] == 2 and second["resolved"] == 2 and second["change"] == 0.5


def test_swapped_outcomes_cancel_in_the_change_but_widen_the_interval() -> None:
    before = round_(0, ["resolved"] * 10 + ["no_patch"] * 10)
    after = round_(5, ["no_patch"] * 10 + ["resolved"] * 10)
    (_, second) = report.heldout_changes([before, after])
    assert second["change"] == 0.0 and second["change_ci95"][0] < -0.2 and second["change_ci95"][1] > 0.2


def test_verdict_errors_are_grouped_by_their_first_line_with_paths_and_numbers_blanked() -> None:
    errors = {"a": "error: patch failed: voluptuous/validators.py:123\nerror: voluptuous/validators.py: patch does "
                   "not apply", "b": "error: patch failed: schema/__init__.py:9", "c": "corrupt patch at line 14"}
    assert report.error_kinds(errors) == {"error: patch failed: PATH:N": 2, "corrupt patch at line N": 1}


def test_a_committed_report_reads_its_answers_back_from_beside_it() -> None:
    """The fifth run's reports keep their logged held-out answers in `*.answers.json.xz`: read back, they give the
    held-out figures the report holds (the bootstrap is seeded)."""
    for mode in ("sync", "async"):
        path = ROOT / "benchmarks" / "results" / "swe_speedrun" / "fifth_run" / f"grpo_{mode}.json"
        full = report.load_report(path)
        assert [r["step"] for r in full["validation_tasks"]] == [r["step"] for r in full["heldout"]]
        assert report.heldout_changes(full["validation_tasks"]) == full["heldout"]
