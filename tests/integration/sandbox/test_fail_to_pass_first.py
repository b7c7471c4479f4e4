"""`TaskSpec.fail_to_pass_first` on the real executor: the FAIL_TO_PASS tests run alone first, and a verdict is
settled there only when every one of them ran and none passed; anything else gets the full run, whose verdict is the
one a spec without the flag gets. The reward under `fail_to_pass` and `binary` never changes."""

from __future__ import annotations

import logging

import pytest
from sandbox_helpers import ADD_ONLY, CORE, F2P, FIXED, P2P, CalcRepo

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import Verdict
from sandbox_client.reward import reward_from_verdict
from services.sandbox.executor import Executor
from services.sandbox.runlog import read_run_log
from services.sandbox.verdicts import FIRST_RUN_NOTE


def same_grade(a: Verdict, b: Verdict) -> None:
    assert (a.status, a.resolution, a.test_status, a.report) == (b.status, b.resolution, b.test_status, b.report)


async def test_an_answer_that_fixes_no_failing_test_is_settled_by_the_failing_tests_alone(
        executor: Executor, calc_repo: CalcRepo) -> None:
    full = await executor.run(calc_repo.spec(""))
    first = await executor.run(calc_repo.spec("", fail_to_pass_first=True))
    assert (first.status, first.resolution, first.patch_applied) == ("completed", "NO", True)
    assert first.test_status == {t: "FAILED" for t in F2P}  # the spaced parametrised id matched too
    assert sorted(first.report["FAIL_TO_PASS"]["failure"]) == sorted(F2P)
    assert FIRST_RUN_NOTE in first.error
    assert "first_tests_s" in first.timings and "tests_s" not in first.timings
    for mode in ("binary", "fail_to_pass"):
        assert reward_from_verdict(first, mode) == reward_from_verdict(full, mode) == 0.0  # type: ignore[arg-type]
    assert set(full.test_status) == set(F2P + P2P)  # without the flag: the task's whole test files


@pytest.mark.parametrize("fix", ["gold", "partial", "breaks_a_passing_test"])
async def test_an_answer_that_fixes_a_failing_test_gets_the_full_run_in_a_fresh_tree(
        executor: Executor, calc_repo: CalcRepo, fix: str) -> None:
    patch = {"gold": calc_repo.gold, "partial": calc_repo.diff({"calc/core.py": ADD_ONLY}),
             "breaks_a_passing_test": calc_repo.diff({"calc/core.py": FIXED.replace("return -x", "return x")})}[fix]
    full = await executor.run(calc_repo.spec(patch))
    first = await executor.run(calc_repo.spec(patch, fail_to_pass_first=True))
    same_grade(first, full)
    assert {"first_tests_s", "tests_s"} <= set(first.timings) and FIRST_RUN_NOTE not in first.error
    assert first.resolution == {"gold": "FULL", "partial": "PARTIAL", "breaks_a_passing_test": "NO"}[fix]


async def test_the_first_run_formats_no_traceback_unless_configured_and_grades_the_same(
        sandbox_cfg: SandboxConfig, calc_repo: CalcRepo) -> None:
    """pytest formats a failing test's traceback by parsing each frame's source file: the first run, whose output
    no one reads, skips it (`sandbox.first_run_tracebacks`); the verdict is the same either way, and the full run
    keeps the task's own `--tb`."""
    breaks = calc_repo.diff({"calc/core.py": FIXED.replace("return -x", "return x")})
    verdicts: dict[bool, tuple[Verdict, Verdict]] = {}
    for tracebacks in (False, True):
        async with Executor(sandbox_cfg.model_copy(update={"first_run_tracebacks": tracebacks})) as ex:
            verdicts[tracebacks] = (await ex.run(calc_repo.spec("", fail_to_pass_first=True)),
                                    await ex.run(calc_repo.spec(breaks, fail_to_pass_first=True)))
    (quiet, quiet_full), (loud, loud_full) = verdicts[False], verdicts[True]
    same_grade(quiet, loud)
    assert FIRST_RUN_NOTE in quiet.error and quiet.resolution == "NO"
    assert "assert add(2, 3) == 5" in loud.stdout_tail  # the failing line, quoted by the traceback
    assert "assert add(2, 3) == 5" not in quiet.stdout_tail
    assert "FAILED tests/test_core.py::test_add" in quiet.stdout_tail  # -rfE's summary stays
    same_grade(quiet_full, loud_full)
    assert "tests_s" in quiet_full.timings and "assert neg(x) == -x" in quiet_full.stdout_tail


async def test_a_failing_test_the_first_run_does_not_report_leaves_the_verdict_to_the_full_run(
        executor: Executor, calc_repo: CalcRepo) -> None:
    """An id that names no collected test (a harness's spelling, a test the patch removes) is missing from the first
    run: it says nothing sure, and the full run grades."""
    f2p = [*F2P, "tests/test_core.py::test_not_there"]
    full = await executor.run(calc_repo.spec("", fail_to_pass=f2p))
    first = await executor.run(calc_repo.spec("", fail_to_pass=f2p, fail_to_pass_first=True))
    same_grade(first, full)
    assert "tests_s" in first.timings and set(first.test_status) >= set(P2P)


async def test_the_task_set_command_runs_the_subset_and_a_shell_command_ignores_the_flag(
        executor: Executor, calc_repo: CalcRepo) -> None:
    pytest_form = "PYTHONHASHSEED=0 python -m pytest -p no:cacheprovider -q tests"
    first = await executor.run(calc_repo.spec("", test_command=pytest_form, fail_to_pass_first=True))
    assert first.test_status == {t: "FAILED" for t in F2P} and FIRST_RUN_NOTE in first.error
    shell = await executor.run(calc_repo.spec("", test_command="cd . && python -m pytest -q tests",
                                              fail_to_pass_first=True))
    assert "first_tests_s" not in shell.timings and set(shell.test_status) >= set(P2P)


async def test_a_first_run_past_the_time_limit_is_the_verdict(executor: Executor, calc_repo: CalcRepo) -> None:
    """The full run holds every test of the first one: past the limit alone, it would be past it too."""
    hangs = calc_repo.diff({"calc/core.py": CORE.replace("    return a - b", "    while True:\n        pass")})
    first = await executor.run(calc_repo.spec(hangs, timeout=3.0, fail_to_pass_first=True))
    assert (first.status, first.resolution) == ("timeout", "NO") and FIRST_RUN_NOTE in first.error
    assert "tests_s" not in first.timings  # one run of 3 s, not two
    assert reward_from_verdict(first, "fail_to_pass") == 0.0


async def test_each_run_logs_its_phases_and_the_log_reads_back_to_the_verdicts_timings(
        executor: Executor, calc_repo: CalcRepo, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="services.sandbox.executor")
    verdicts = [await executor.run(calc_repo.spec(calc_repo.gold, fail_to_pass_first=True)),
                await executor.run(calc_repo.spec("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n"))]
    runs = read_run_log(caplog.text)
    assert [status for status, _ in runs] == ["completed", "not_applied"]
    for (_, logged), verdict in zip(runs, verdicts, strict=True):
        assert logged.keys() == verdict.timings.keys()
        assert all(abs(logged[k] - verdict.timings[k]) < 1e-3 for k in logged)
    assert {"first_tests_s", "tests_s", "checkout_s", "total_s"} <= runs[0][1].keys()
