"""The speedrun's held-out comparison (`report.heldout_changes`): rounds compared task by task, a paired
bootstrap interval, and tasks with an infrastructure error in either round left out of the pair."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

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


def builder_row(instance_id: str, kind: str, split: str) -> dict[str, object]:
    """A row in the layout `grpo-fleet data build` writes (SWE-bench's keys and the builder's own)."""
    patch = ("diff --git a/toolz/x.py b/toolz/x.py\n--- a/toolz/x.py\n+++ b/toolz/x.py\n@@ -1,2 +1,2 @@\n"
             " def f(a, b):\n-    return a <= b\n+    return a < b\n")
    return {"instance_id": instance_id, "repo": "toolz", "base_commit": "0" * 40, "patch": patch, "test_patch": "",
            "problem_statement": "tests/test_x.py::test_y fails", "hints_text": "", "created_at": "2026-01-01",
            "version": "1.2.0", "environment_setup_commit": "0" * 40, "FAIL_TO_PASS": ["tests/test_x.py::test_y"],
            "PASS_TO_PASS": [], "repo_url": "", "test_command": "pytest", "test_files": ["tests/test_x.py"],
            "bug_kind": kind, "function": "f", "file": "toolz/x.py", "split": split, "package": "toolz",
            "recipe_version": 1}


def test_training_on_some_bug_kinds_leaves_the_validation_split_whole(tmp_path: Path) -> None:
    import json

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import swe_speedrun

    kinds = ["cmp_flip", "remove_assign", "const_change", "remove_loop"]
    for split in ("train", "validation"):
        (tmp_path / f"{split}.jsonl").write_text("".join(
            json.dumps(builder_row(f"{split}{i}", k, split)) + "\n" for i, k in enumerate(kinds)))
    name, n = swe_speedrun.train_split(tmp_path, swe_speedrun.parse_kinds("in-place"), frames=False)
    chosen = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    assert n == 2 and [r["bug_kind"] for r in chosen] == ["cmp_flip", "const_change"]
    assert len((tmp_path / "validation.jsonl").read_text().splitlines()) == 4
    assert swe_speedrun.parse_kinds("remove_loop,cmp_flip") == {"remove_loop", "cmp_flip"}
    with pytest.raises(SystemExit, match="unknown bug kind.*remove_everything"):
        swe_speedrun.parse_kinds("remove_everything")
    with pytest.raises(SystemExit, match="no training task"):
        swe_speedrun.train_split(tmp_path, frozenset({"op_swap"}), frames=False)


def test_the_two_bug_families_split_each_round_of_a_real_report() -> None:
    """The fifth run's rounds split into in-place and removal bugs: the families' tasks and resolves add up to the
    whole round's, each compared with its own first round."""
    path = ROOT / "benchmarks" / "results" / "swe_speedrun" / "fifth_run" / "grpo_async.json"
    rounds = report.load_report(path)["validation_tasks"]
    kinds = {t: ("remove_assign" if i % 3 == 0 else "cmp_flip") for i, t in enumerate(rounds[0]["verdicts"])}
    fam = report.family_changes(rounds, kinds)
    whole = report.heldout_changes(rounds)
    assert [a["tasks"] + b["tasks"] for a, b in zip(fam["in_place"], fam["removal"], strict=True)] == \
        [w["tasks"] for w in whole]
    assert [a["resolved"] + b["resolved"] for a, b in zip(fam["in_place"], fam["removal"], strict=True)] == \
        [w["resolved"] for w in whole]
    assert fam["in_place"][0]["change"] == fam["removal"][0]["change"] == 0.0


LIBRARY_TRACEBACK = """I ran the test suite of isodate and got failures.

```
test_parse[19850412T1015-expected0]
tests/test_datetime.py:151: in test_parse
    assert parse_datetime(datetimestring) == expected
src/isodate/isodatetime.py:33: in parse_datetime
    return datetime.combine(tmptime, tmpdate)
E   TypeError: combine() argument 1 must be datetime.date, not datetime.time
```
"""

TEST_ONLY_TRACEBACK = """These 2 tests fail:

```
test_y
tests/test_x.py:12: in test_y
    assert f(1, 2)
E   assert False
```
"""


def test_training_on_tasks_whose_traceback_passes_through_the_library(tmp_path: Path) -> None:
    """`--train-frames` keeps the training tasks whose statement shows a frame outside the tests (the line that
    raised is then in the prompt), read off the statement in the builder's layout; validation stays whole."""
    import json

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import swe_speedrun

    assert swe_speedrun.library_frames(LIBRARY_TRACEBACK, ["tests/test_datetime.py"])
    assert not swe_speedrun.library_frames(TEST_ONLY_TRACEBACK, ["tests/test_x.py"])
    # A test file named by the task is a test file wherever it lives (pytest prints it relative to the checkout).
    assert not swe_speedrun.library_frames(TEST_ONLY_TRACEBACK.replace("tests/test_x.py", "check_x.py"),
                                           ["check_x.py"])
    assert not swe_speedrun.library_frames("tests/test_x.py::test_y fails", ["tests/test_x.py"])
    rows = []
    for i, (kind, statement) in enumerate([("cmp_flip", LIBRARY_TRACEBACK), ("cmp_flip", TEST_ONLY_TRACEBACK),
                                           ("remove_assign", LIBRARY_TRACEBACK)]):
        row = builder_row(f"train{i}", kind, "train")
        row["problem_statement"] = statement
        rows.append(row)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "validation.jsonl").write_text(json.dumps(builder_row("val0", "cmp_flip", "validation")) + "\n")
    name, n = swe_speedrun.train_split(tmp_path, None, frames=True)
    assert n == 2 and [json.loads(x)["instance_id"] for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()] \
        == ["train0", "train2"]
    name, n = swe_speedrun.train_split(tmp_path, swe_speedrun.parse_kinds("in-place"), frames=True)
    assert n == 1
    with pytest.raises(SystemExit, match="library frame"):
        swe_speedrun.train_split(tmp_path, frozenset({"op_swap"}), frames=True)
    assert len((tmp_path / "validation.jsonl").read_text().splitlines()) == 1
