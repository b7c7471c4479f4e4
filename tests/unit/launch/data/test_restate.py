"""`restate_rows` decides per row from the sandbox's verdict: a rerun that fails as the row says gets the recipe's
statement; anything else keeps the row's own statement and is counted, never dropped. The sandbox here is a
function returning verdicts of the real type; the real executor's runs are in
tests/integration/launch/test_taskset_build.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fleet.contracts.sandbox import TaskSpec, Verdict
from launch.data.recipe import DEFAULT_RECIPE, Recipe, load_recipe
from launch.data.restate import RestateReport, restate_rows

OUTPUT = """\
=================================== FAILURES ===================================
__________________________________ test_load ___________________________________
tests/test_lib.py:5: in test_load
    assert load('"a"') == "b"
inflection/__init__.py:9: in load
    return value + 1
E   TypeError: can only concatenate str (not "int") to str
=========================== short test summary info ============================
FAILED tests/test_lib.py::test_load - TypeError
"""
F2P = "test_inflection.py::test_load"


def row(iid: str, repo: str = "inflection") -> dict[str, Any]:
    return {"instance_id": iid, "repo": repo, "repo_url": f"embedded://{repo}", "base_commit": "c" * 40,
            "test_command": "python -m pytest test_inflection.py", "package": "inflection", "version": "0.5.1",
            "FAIL_TO_PASS": [F2P], "PASS_TO_PASS": ["test_inflection.py::test_other"],
            "problem_statement": "old statement", "patch": "diff --git ...", "split": "train"}


def framed() -> Recipe:
    return load_recipe(DEFAULT_RECIPE).model_copy(update={"statement_frames": "repository"})


def restate(rows: list[dict[str, Any]], verdicts: dict[str, Verdict]) -> tuple[list[dict[str, Any]], RestateReport]:
    by_commit = {r["base_commit"]: r["instance_id"] for r in rows}
    seen: list[TaskSpec] = []

    async def run(spec: TaskSpec) -> Verdict:
        seen.append(spec)
        assert spec.patch == "" and spec.fail_to_pass == [F2P]
        return verdicts[by_commit[spec.base_commit]]

    report = RestateReport()
    out = asyncio.run(restate_rows(rows, framed(), run, 2, report))
    return out, report


def test_each_row_is_restated_or_kept_and_counted_never_dropped() -> None:
    rows = [row("a"), {**row("b"), "base_commit": "b" * 40}, {**row("c"), "base_commit": "d" * 40},
            {**row("d", repo="nope"), "base_commit": "e" * 40}]
    failing = Verdict(status="completed", test_status={F2P: "FAILED"}, stdout_tail=OUTPUT)
    verdicts = {"a": failing, "b": Verdict(status="completed", test_status={F2P: "PASSED"}, stdout_tail=OUTPUT),
                "c": Verdict(status="timeout")}
    out, report = restate(rows, verdicts)
    assert [r["instance_id"] for r in out] == ["a", "b", "c", "d"]
    assert "inflection/__init__.py:9: in load" in out[0]["problem_statement"]
    assert {k: v for k, v in out[0].items() if k != "problem_statement"} == \
        {k: v for k, v in rows[0].items() if k != "problem_statement"}
    assert [r["problem_statement"] for r in out[1:]] == ["old statement"] * 3
    assert report.rows == 4 and report.changed == 1
    assert report.kept == {"not_failing": 1, "timeout": 1, "unknown_repo": 1}


def test_a_row_not_made_by_the_builder_is_refused_naming_it() -> None:
    hub_row = {k: v for k, v in row("astropy__astropy-12907").items() if k not in ("package", "test_command")}
    with pytest.raises(ValueError, match=r"'astropy__astropy-12907' lacks test_command, package"):
        restate([hub_row], {})
