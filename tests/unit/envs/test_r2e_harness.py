"""R2E-Gym rows load as image tasks graded the way R2E-Gym's runtime grades them.

The row (`data/r2e_gym_row.json`) is in R2E-Gym-Subset's layout and was made by R2E-Gym's own code: its
`parsed_commit_content` by `CommitParser.parse_commit` on a real git diff, its `expected_output_json` by
`parse_log_pytest` on the real output of R2E's `run_tests.sh` (kept in `execution_result_content`, as R2E keeps it),
and `r2e_gold_patch` is R2E's `ParsedCommit.get_patch(test_file=False)` of that commit.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from envs.registry import load_dataset
from envs.swe.harnesses import r2e as harness
from envs.swe.harnesses.r2e import parse_r2e_gym
from envs.swe.loaders import DatasetFormatError, Unsupported
from envs.swe.payload import payload_to_spec, task_to_payload
from fleet.config.env import DatasetConfig
from fleet.contracts.sandbox import SpecError, TaskSpec, spec_from_json
from services.sandbox.images import contract
from services.sandbox.images.parsers import r2e as parsers

DATA = json.loads((Path(__file__).parent / "data" / "r2e_gym_row.json").read_text())
ROW: dict[str, Any] = DATA["row"]
EXECUTION = json.loads(ROW["execution_result_content"])
GOLD_RUN, BASE_RUN = EXECUTION["new_commit_res_stdout"], EXECUTION["old_commit_res_stdout"]


def _task() -> Any:
    task, errors = parse_r2e_gym(copy.deepcopy(ROW), 1)
    assert errors == [] and task is not None
    return task


def _spec(patch: str = "") -> TaskSpec:
    return payload_to_spec(task_to_payload(_task()), patch)


def _eval_log(run_tests_output: str, exit_code: int) -> str:
    """The eval log as the executor reads it: the script's `set -x` trace (stderr, merged) around the tests' output."""
    return ("+ cd /testbed\n+ mv /testbed/run_tests.sh /root/run_tests.sh\n+ : '>>>>> Start Test Output'\n"
            f"+ bash /root/run_tests.sh\n{run_tests_output}+ SWEBENCH_TEST_EXIT_CODE={exit_code}\n"
            f"+ : '>>>>> End Test Output'\n>>>>> Test Exit Code: {exit_code}\n")


def _grade(run_tests_output: str, exit_code: int = 1) -> Any:
    spec = _spec()
    return contract.grade(spec, contract.test_spec(spec, []), _eval_log(run_tests_output, exit_code))


def test_row_in_r2e_gym_subset_layout_becomes_an_image_task() -> None:
    task = _task()
    assert task.instance_id == f"pillow_final:{ROW['commit_hash']}"
    assert task.repo == "pillow" and task.base_commit == "HEAD"
    assert task.metadata["image"] == ROW["docker_image"]
    assert task.metadata["log_parser"] == "r2e_parse_log_pytest"
    assert task.metadata["expected_status"] == json.loads(ROW["expected_output_json"])
    # R2E's get_task_instruction: the agent sees what is inside [ISSUE]...[/ISSUE].
    assert task.problem_statement.startswith("\nparse_header returns the width twice")
    assert "[ISSUE]" not in task.problem_statement


def test_gold_patch_is_what_r2e_makes_of_parsed_commit_content() -> None:
    patch = _task().patch
    assert patch == DATA["r2e_gold_patch"]
    assert "imgfile/core.py" in patch and "new file mode 100644" in patch
    assert "Tests/test_core.py" not in patch and "CHANGES.rst" not in patch  # test files and non-Python left out


def test_eval_script_runs_r2e_setup_then_run_tests_between_the_markers() -> None:
    script = harness.eval_script()
    assert script.startswith("#!/bin/bash\nset -uxo pipefail\ncd /testbed\n")
    lines = script.splitlines()
    order = ["export PATH=/root/.venv/bin:/root/.local/bin:", "find . -name '*.pyc' -delete",
             "mv /testbed/run_tests.sh /root/run_tests.sh", "mv /r2e_tests /root/r2e_tests",
             "ln -s /root/r2e_tests /testbed/r2e_tests", ": '>>>>> Start Test Output'", "bash /root/run_tests.sh",
             ": '>>>>> End Test Output'"]
    at = [next(i for i, line in enumerate(lines) if line.startswith(step)) for step in order]
    assert at == sorted(at)
    # swebench records the test command's exit code after the end marker, so the log's claim can be checked.
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in contract.test_spec(_spec(), []).eval_script


def test_parser_keys_results_the_r2e_way_not_as_node_ids() -> None:
    parsed = parsers.parse_log_pytest(GOLD_RUN, None)
    assert parsed == json.loads(ROW["expected_output_json"])
    assert parsed["TestImageFile.test_parser"] == "PASSED" and parsed["test_square_header"] == "FAILED"
    coloured = GOLD_RUN.replace("PASSED r2e", "\x1b[32mPASSED\x1b[0m r2e").replace("\n", "\r\n")
    assert parsers.parse_log_pytest(coloured, None) == parsed


def test_gold_run_log_grades_full_with_its_expected_failure() -> None:
    verdict = _grade(GOLD_RUN, EXECUTION["new_commit_res_code"])
    assert verdict.resolution == "FULL", verdict.error
    assert verdict.report == {"expected_status": {"success": sorted(json.loads(ROW["expected_output_json"])),
                                                  "failure": []}}
    assert (verdict.tests_passed, verdict.tests_failed) == (3, 1)


def test_base_commit_run_grades_no() -> None:
    verdict = _grade(BASE_RUN, EXECUTION["old_commit_res_code"])
    assert verdict.resolution == "NO"
    assert verdict.report["expected_status"]["failure"] == ["TestImageFile.test_parser"]


@pytest.mark.parametrize("old,new", [
    # the test R2E expects to fail passes: exact match, so not FULL
    ("FAILED r2e_tests/test_1.py::test_square_header - assert (5, 5) == (5, 6)",
     "PASSED r2e_tests/test_1.py::test_square_header"),
    ("PASSED r2e_tests/test_1.py::test_bad_header\n", ""),  # one test missing
    ("PASSED r2e_tests/test_1.py::test_bad_header\n",  # one test more
     "PASSED r2e_tests/test_1.py::test_bad_header\nPASSED r2e_tests/test_1.py::test_extra\n"),
])
def test_one_status_off_grades_no(old: str, new: str) -> None:
    assert old in GOLD_RUN
    assert _grade(GOLD_RUN.replace(old, new)).resolution == "NO"


def test_exact_match_cuts_keys_at_dash_and_drops_colour_as_r2e_does() -> None:
    expected = {"TestA.test_x - reason": "FAILED", "\x1b[1mtest_y": "PASSED"}
    assert parsers.exact_match({"TestA.test_x": "FAILED", "test_y": "PASSED"}, expected)[0]
    assert not parsers.exact_match({"TestA.test_x": "FAILED", "test_z": "PASSED"}, expected)[0]


def test_parser_lists_of_loader_and_sandbox_agree() -> None:
    assert harness.R2E_REPOS == parsers.R2E_REPOS
    assert harness.LOG_PARSER in parsers.PARSERS


def test_expected_status_travels_to_the_sandbox_and_back() -> None:
    spec = _spec(_task().patch)
    wire = spec.to_json()
    assert wire["expected_status"] == json.loads(ROW["expected_output_json"])
    assert spec_from_json(wire) == spec
    assert "expected_status" not in TaskSpec(repo_url="r", base_commit="c", patch="", test_command="t").to_json()


@pytest.mark.parametrize("value,image", [({"t": 1}, "a/b:c"), ([], "a/b:c"), ({}, "a/b:c"), ({"t": "PASSED"}, None)])
def test_bad_expected_status_is_refused_naming_the_field(value: Any, image: str | None) -> None:
    body = {"repo_url": "r", "base_commit": "HEAD", "patch": "", "eval_script": None, "test_command": "t",
            "image": image, "expected_status": value}
    with pytest.raises(SpecError, match="^expected_status: ") as info:
        spec_from_json(body)
    assert info.value.field == "expected_status"


@pytest.mark.parametrize("change,message", [
    ({"parsed_commit_content": None}, "field parsed_commit_content: must be the JSON text of R2E's ParsedCommit"),
    ({"parsed_commit_content": json.dumps({"file_diffs": [{"hunks": []}]})},
     "field parsed_commit_content: is not an R2E ParsedCommit"),
    ({"expected_output_json": "[]"}, "field expected_output_json: must be a non-empty JSON object"),
    ({"expected_output_json": {"t": "PASSED"}}, "field expected_output_json: must be JSON text"),
    ({"repo_name": None}, "field repo_name: missing"),
    ({"docker_image": None, "commit_hash": None}, "field docker_image: missing"),
])
def test_bad_rows_name_the_row_and_field(change: dict[str, Any], message: str) -> None:
    task, errors = parse_r2e_gym({**ROW, **change}, 3)
    assert task is None
    assert any(e.startswith("row 3") and message in e for e in errors), errors


@pytest.mark.parametrize("change,family", [
    ({"repo_name": "django"}, "R2E-Gym repo django"),
    ({"docker_image": "namanjain12/swebench_verified:x"}, "R2E-Gym SWE-bench images"),
])
def test_rows_r2e_cannot_grade_are_refused_at_load_time(change: dict[str, Any], family: str,
                                                        tmp_path: Path) -> None:
    _, errors = parse_r2e_gym({**ROW, **change}, 1)
    assert [type(e) for e in errors] == [Unsupported] and errors[0].family == family  # type: ignore[attr-defined]
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({**ROW, **change}) + "\n" + json.dumps(ROW) + "\n")
    with pytest.raises(DatasetFormatError, match=f"1 row\\(s\\) of {family}: "):
        load_dataset(DatasetConfig(dataset_name="r2e_gym", data_path=str(path)))


# The apply chain between attempts: a failed attempt's leftovers go, the untracked files the image ships stay.

_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def _testbed(root: Path) -> Path:
    tb = root / "testbed"
    (tb / "imgfile").mkdir(parents=True)
    for diff in json.loads(ROW["parsed_commit_content"])["file_diffs"]:
        if diff["old_file_content"]:
            (tb / diff["header"]["file"]["path"]).parent.mkdir(parents=True, exist_ok=True)
            (tb / diff["header"]["file"]["path"]).write_text(diff["old_file_content"])
    env = {**os.environ, **_GIT_ENV}
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(tb), *argv], check=True, capture_output=True, env=env)
    (tb / "run_tests.sh").write_text(DATA["run_tests_sh"])  # untracked, as R2E's Dockerfiles COPY it in
    (tb / ".venv" / "bin").mkdir(parents=True)
    (tb / ".venv" / "bin" / "python").symlink_to("/usr/bin/python3")
    return tb


def _apply(tb: Path, patch: str) -> subprocess.CompletedProcess[str]:
    (tb.parent / "patch.diff").write_text(patch)
    script = contract.apply_script(str(tb), str(tb.parent / "patch.diff"))
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env={**os.environ, **_GIT_ENV})


def _untracked(tb: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(tb), "ls-files", "--others", "--exclude-standard"], capture_output=True,
                         text=True, check=True).stdout
    return sorted(out.split())


def test_fuzzy_patch_applies_after_failed_attempts_and_the_images_untracked_files_survive(tmp_path: Path) -> None:
    tb = _testbed(tmp_path)
    # A context line off by a little: every `git apply` refuses it (the --reject one after creating util.py and a
    # .rej file), `patch --fuzz` takes it, which needs the failed attempts' files gone first.
    fuzzy = DATA["r2e_gold_patch"].replace(" def scale(n, k):", " def scale(n, k):  # fuzz")
    result = _apply(tb, fuzzy)
    assert "GRPO_APPLIED" in result.stdout, result.stdout + result.stderr
    assert "int(width), int(height)" in (tb / "imgfile" / "core.py").read_text()
    # No .rej from the --reject attempt; the .orig is `patch`'s own backup of the fuzzy apply, as in swebench.
    assert _untracked(tb) == [".venv/bin/python", "imgfile/core.py.orig", "imgfile/util.py", "run_tests.sh"]
    assert (tb / "run_tests.sh").read_text() == DATA["run_tests_sh"]


def test_patch_that_never_applies_keeps_what_the_image_shipped(tmp_path: Path) -> None:
    tb = _testbed(tmp_path)
    broken = DATA["r2e_gold_patch"].replace("-    return int(width), int(width)", "-    return width")
    assert _apply(tb, broken).returncode == 1
    # What the last attempt (`patch`) left stays, as in swebench, where the reverse check follows it unreset.
    assert {".venv/bin/python", "run_tests.sh"} <= set(_untracked(tb))
    assert (tb / "run_tests.sh").read_text() == DATA["run_tests_sh"]


def test_patch_over_a_file_the_image_ships_untracked_is_named() -> None:
    shipped = ["run_tests.sh", ".venv/"]
    assert contract.touches_shipped(["imgfile/core.py", "run_tests.sh"], shipped) == "run_tests.sh"
    assert contract.touches_shipped([".venv/bin/pytest"], shipped) == ".venv/bin/pytest"
    assert contract.touches_shipped(["imgfile/core.py", "run_tests.sh.bak"], shipped) is None
