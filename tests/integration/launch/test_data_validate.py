"""`grpo-fleet data validate --gold N` on real tasks: the sandbox tests' `calc` repository as SWE-bench rows, graded by
a real in-process executor (bwrap), exactly as training would grade them."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sandbox"))

from sandbox_helpers import ADD_ONLY, F2P, P2P, UID_BASE, CalcRepo, make_calc_repo  # noqa: E402

from launch.cli import main  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                reason="the sandbox needs bubblewrap and root (one uid per pool slot)")


def _row(calc: CalcRepo, instance_id: str, patch: str, **extra: object) -> dict[str, object]:
    return {"instance_id": instance_id, "repo": "calc/calc", "repo_url": str(calc.path), "base_commit": calc.base,
            "patch": patch, "test_patch": calc.test_patch, "problem_statement": "add and mul are wrong",
            "FAIL_TO_PASS": F2P, "PASS_TO_PASS": P2P, **extra}


def _validate(tmp_path: Path, rows: list[dict[str, object]], *extra: str) -> int:
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return main(["data", "validate", *extra, "data.train.dataset_name=swebench", f"data.train.data_path={data}",
                 f"sandbox.work_root={tmp_path / 'work'}", f"sandbox.uid_base={UID_BASE}", "sandbox.pool_size=2"])


def test_a_dataset_whose_gold_resolves_validates_and_exits_zero(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_calc_repo(tmp_path / "calc")
    rows = [_row(repo, "calc__calc-1", repo.gold), _row(repo, "calc__calc-2", repo.gold)]
    report = tmp_path / "report.json"
    assert _validate(tmp_path, rows, "--gold", "0", "--workers", "2", "--out", str(report)) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == ["calc/calc", "2", "2", "2", "0", "0", "100%"]
    assert "all 2 rows validate" in out
    # What a run costs on this host, from the executor's own timings: four runs (gold and empty of each row).
    assert "one sandbox run: median" in out and "over 4 runs" in out
    times = json.loads(report.read_text())["run_times"]
    assert times["runs"] == 4
    tests, total = times["phases"]["tests_s"], times["phases"]["total_s"]
    assert 0 < tests["median"] <= tests["p90"] <= tests["max"] < total["max"]


def test_a_gold_that_does_not_resolve_exits_nonzero_and_names_the_instance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_calc_repo(tmp_path / "calc")
    half_fix = repo.diff({"calc/core.py": ADD_ONLY})  # fixes add only: mul's FAIL_TO_PASS still fails
    rows = [_row(repo, "calc__calc-good", repo.gold), _row(repo, "calc__calc-halffix", half_fix),
            _row(repo, "gone__gone-1", repo.gold, repo="gone/gone", repo_url=str(tmp_path / "no-such-repo"))]
    report = tmp_path / "report.json"
    assert _validate(tmp_path, rows, "--gold", "3", "--out", str(report)) == 1
    out = capsys.readouterr().out
    table = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:4]}
    assert table["calc/calc"] == ["2", "1", "2", "0", "0", "50%"]
    assert table["gone/gone"] == ["1", "0", "0", "0", "2", "0%"]  # both runs: infrastructure, never a failed patch
    assert "2 of 3 rows do not validate" in out
    assert "calc__calc-halffix [calc/calc]: gold PARTIAL; empty NO" in out
    assert "gone__gone-1 [gone/gone]: gold infra_error (" in out
    written = json.loads(report.read_text())
    assert written["ok"] is False and written["total"]["gold FULL"] == 1
    assert {r["instance_id"]: r["ok"] for r in written["rows"]} == {
        "calc__calc-good": True, "calc__calc-halffix": False, "gone__gone-1": False}


def test_a_bad_dataset_file_is_printed_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = make_calc_repo(tmp_path / "calc")
    assert _validate(tmp_path, [_row(repo, "calc__calc-1", "")], "--gold", "1") == 2
    assert "row 1 (calc__calc-1): field patch: empty" in capsys.readouterr().err
