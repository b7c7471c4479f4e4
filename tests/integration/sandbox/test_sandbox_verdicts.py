"""The executor in-process (as the task-set builder uses it): every verdict the issue lists, on a real repository."""

from __future__ import annotations

from pathlib import Path

import pytest
from sandbox_helpers import ADD_ONLY, CORE, F2P, FIXED, P2P, CalcRepo, entries, git, sandbox_pids

from fleet.config.infra import SandboxConfig
from fleet.contracts.sandbox import SpecError, TaskSpec
from services.sandbox.executor import Executor

SPACE_ID = "tests/test_mul.py::TestMul::test_mul[two three]"


async def test_gold_patch_resolves_full_with_exact_ids(executor: Executor, calc_repo: CalcRepo) -> None:
    v = await executor.run(calc_repo.spec(calc_repo.gold))
    assert (v.status, v.resolution, v.patch_applied, v.test_patch_applied) == ("completed", "FULL", True, True)
    assert v.test_status == {t: "PASSED" for t in F2P + P2P}
    assert SPACE_ID in v.report["FAIL_TO_PASS"]["success"]
    assert (v.tests_passed, v.tests_failed, v.exit_code) == (6, 0, 0)
    assert {"checkout_s", "apply_s", "tests_s", "grade_s", "total_s"} <= set(v.timings)
    assert sandbox_pids() == []


async def test_empty_patch_is_no(executor: Executor, calc_repo: CalcRepo) -> None:
    v = await executor.run(calc_repo.spec(""))
    assert (v.status, v.resolution, v.patch_applied) == ("completed", "NO", True)
    assert v.test_status[SPACE_ID] == v.test_status["tests/test_mul.py::TestMul::test_mul[zero]"] == "FAILED"
    assert sorted(v.report["FAIL_TO_PASS"]["failure"]) == sorted(F2P)


async def test_partial_fix_is_partial(executor: Executor, calc_repo: CalcRepo) -> None:
    v = await executor.run(calc_repo.spec(calc_repo.diff({"calc/core.py": ADD_ONLY})))
    assert (v.status, v.resolution) == ("completed", "PARTIAL")
    assert v.report["FAIL_TO_PASS"] == {"success": ["tests/test_core.py::test_add"],
                                        "failure": [SPACE_ID, "tests/test_mul.py::TestMul::test_mul[zero]"]}


async def test_fix_that_breaks_a_passing_test_is_no(executor: Executor, calc_repo: CalcRepo) -> None:
    broken = FIXED.replace("return -x", "return x")
    v = await executor.run(calc_repo.spec(calc_repo.diff({"calc/core.py": broken})))
    assert v.resolution == "NO" and v.report["FAIL_TO_PASS"]["failure"] == []
    assert "tests/test_core.py::test_neg[1]" in v.report["PASS_TO_PASS"]["failure"]


async def test_patch_that_does_not_apply_is_a_verdict(executor: Executor, calc_repo: CalcRepo) -> None:
    stale = calc_repo.gold.replace("return a - b", "return a // b")
    v = await executor.run(calc_repo.spec(stale))
    assert (v.status, v.patch_applied, v.resolution) == ("not_applied", False, "NO")
    assert "patch does not apply" in v.error
    garbage = await executor.run(calc_repo.spec("this is not a diff"))
    assert garbage.status == "not_applied" and not garbage.is_infra_failure


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"tests/test_core.py": "def test_add():\n    pass\n"}, "test file tests/test_core.py"),
        ({"tests/test_mul.py": "def test_mul():\n    pass\n"}, "a file of the task's test patch"),
        ({"tests/conftest.py": None}, "tests/conftest.py"),
        ({"pytest.py": "raise SystemExit(0)\n"}, "shadow the test runner"),
        ({"setup.cfg": "[metadata]\nname = calc\n\n[tool:pytest]\naddopts = -k nothing\n"},
         "pytest configuration in setup.cfg"),
    ],
)
async def test_tampering_is_refused(executor: Executor, calc_repo: CalcRepo, changes: dict[str, str | None],
                                    reason: str) -> None:
    v = await executor.run(calc_repo.spec(calc_repo.diff({"calc/core.py": FIXED, **changes})))
    assert (v.status, v.resolution) == ("refused", "NO")
    assert reason in v.error and v.error.startswith("integrity check: ")
    assert v.test_status == {}  # nothing ran


async def test_renaming_a_test_file_away_is_refused(executor: Executor, calc_repo: CalcRepo) -> None:
    text = (calc_repo.path / "tests" / "test_core.py").read_text()
    patch = calc_repo.diff({"tests/test_core.py": None, "calc/moved.py": text})
    v = await executor.run(calc_repo.spec(patch))
    assert v.status == "refused" and "tests/test_core.py" in v.error


async def test_non_pytest_edits_of_setup_cfg_are_allowed(executor: Executor, calc_repo: CalcRepo) -> None:
    cfg = (calc_repo.path / "setup.cfg").read_text().replace("name = calc", "name = calc2")
    v = await executor.run(calc_repo.spec(calc_repo.diff({"calc/core.py": FIXED, "setup.cfg": cfg})))
    assert (v.status, v.resolution) == ("completed", "FULL")


async def test_integrity_check_can_be_turned_off(executor: Executor, calc_repo: CalcRepo) -> None:
    patch = calc_repo.diff({"calc/core.py": FIXED, "tests/test_core.py": "def test_add():\n    pass\n"})
    v = await executor.run(calc_repo.spec(patch, integrity_check=False))
    # test_add no longer exists in the patched file, so the FAIL_TO_PASS list cannot be met.
    assert v.status == "completed" and v.resolution == "NO"


async def test_test_patch_wins_over_the_agents_version_of_its_files(executor: Executor, calc_repo: CalcRepo) -> None:
    patch = calc_repo.diff({"calc/core.py": FIXED, "tests/test_mul.py": "def test_mul():\n    assert True\n"})
    v = await executor.run(calc_repo.spec(patch, integrity_check=False))
    assert v.resolution == "FULL" and SPACE_ID in v.test_status


async def test_test_command_reports_the_status_map(executor: Executor, calc_repo: CalcRepo) -> None:
    cmd = ("PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONPATH=. python -m pytest -p no:cacheprovider -q -o addopts= "
           "tests/test_core.py")
    v = await executor.run(calc_repo.spec("", test_command=cmd, fail_to_pass=[], pass_to_pass=[], test_patch=""))
    assert v.status == "completed" and v.resolution == "NO" and v.exit_code == 1
    assert v.test_status == {"tests/test_core.py::test_add": "FAILED", "tests/test_core.py::test_neg[1]": "PASSED",
                             "tests/test_core.py::test_neg[-2]": "PASSED",
                             "tests/test_core.py::TestNeg::test_zero": "PASSED"}
    ok = await executor.run(calc_repo.spec(calc_repo.gold, test_command=cmd, fail_to_pass=[], pass_to_pass=[]))
    assert (ok.resolution, ok.exit_code) == ("FULL", 0)


async def test_repository_providers(executor: Executor, calc_repo: CalcRepo, tmp_path: Path,
                                    sandbox_cfg: SandboxConfig) -> None:
    v = await executor.run(calc_repo.spec(calc_repo.gold, repo_url=f"file://{calc_repo.path}"))
    assert v.resolution == "FULL"
    repos = tmp_path / "repos"
    repos.mkdir()
    git(calc_repo.path, "clone", "-q", "--bare", str(calc_repo.path), str(repos / "calc.git"))
    async with Executor(sandbox_cfg.model_copy(update={"repos_root": str(repos), "pool_size": 1})) as ex:
        v = await ex.run(calc_repo.spec(calc_repo.gold, repo_url="embedded://calc"))
        assert v.resolution == "FULL"
        missing = await ex.run(calc_repo.spec(calc_repo.gold, repo_url="embedded://nope"))
        assert missing.status == "infra_error" and "calc.git" not in missing.error and "nope" in missing.error


@pytest.mark.parametrize("spec_change", [{"repo_url": "/no/such/repo"}, {"base_commit": "deadbeef" * 5},
                                         {"repo_url": "s3://bucket/repo"}, {"test_patch": "not a diff"}])
async def test_infrastructure_failures_are_not_patch_failures(executor: Executor, calc_repo: CalcRepo,
                                                              spec_change: dict[str, str]) -> None:
    v = await executor.run(calc_repo.spec(calc_repo.gold, **spec_change))
    assert v.status == "infra_error" and v.is_infra_failure and v.error


async def test_a_sandbox_that_cannot_start_is_an_infra_error(sandbox_cfg: SandboxConfig, calc_repo: CalcRepo) -> None:
    ex = Executor(sandbox_cfg.model_copy(update={"python": "/no/such/python"}))
    v = await ex.run(calc_repo.spec(calc_repo.gold))
    assert v.status == "infra_error" and "sandbox could not start" in v.error
    assert ex.health()["status"] == "unhealthy"


async def test_invalid_spec_raises_for_in_process_callers(executor: Executor) -> None:
    with pytest.raises(SpecError):
        await executor.run(TaskSpec(repo_url="r", base_commit="c", patch=""))


async def test_no_tree_is_left_behind(executor: Executor, calc_repo: CalcRepo, sandbox_cfg: SandboxConfig) -> None:
    await executor.run(calc_repo.spec(calc_repo.gold))
    assert sandbox_cfg.work_root is not None and entries(sandbox_cfg.work_root) == []
    # The source repository is untouched.
    assert git(calc_repo.path, "status", "--porcelain") == ""
    assert git(calc_repo.path, "show", "HEAD:calc/core.py") == CORE


SUBTESTS = '''import unittest

from calc.core import add, mul


class TestSub(unittest.TestCase):
    def test_table(self):
        for a, b in [(1, 2), (3, 4)]:
            with self.subTest(a=a, b=b):
                self.assertEqual(add(a, b), a + b)


def test_fixture(subtests):
    for a in (2, 3):
        with subtests.test(a=a):
            assert mul(a, a) == a * a
'''


async def test_tests_with_subtests_are_graded_not_called_a_forged_report(executor: Executor,
                                                                         calc_repo: CalcRepo) -> None:
    # unittest's subTest and pytest's `subtests` fixture report once per subtest inside the call phase: graded as the
    # test's outcome (a failing subtest fails the test), never "reported twice" (an integrity violation).
    f2p = ["tests/test_sub.py::TestSub::test_table", "tests/test_sub.py::test_fixture"]
    spec = calc_repo.spec(calc_repo.gold, test_patch=calc_repo.diff({"tests/test_sub.py": SUBTESTS}),
                          fail_to_pass=f2p, pass_to_pass=[])
    gold, empty = await executor.run(spec), await executor.run(TaskSpec(**{**spec.to_json(), "patch": ""}))
    assert (gold.status, gold.resolution, gold.error) == ("completed", "FULL", "")
    assert gold.test_status == dict.fromkeys(f2p, "PASSED")
    assert (empty.status, empty.resolution) == ("completed", "NO")
    assert empty.test_status == dict.fromkeys(f2p, "FAILED")
