"""princeton-nlp and SWE-Gym rows get their own harness's eval script and parser, and its gold-run logs grade FULL.

The comparison with swebench 4.1 is live: `make setup` installs swebench 4.1 beside swebench 5
(`.venv/opt/swebench-4.1`, `--no-deps --target`), and a subprocess with that on its path runs 4.1's own
`make_test_spec` over one row per repo and version of its specs. The SWE-Gym fork is not on PyPI: its output is
recorded (`data/swe_gym_fork_eval_scripts.json`, with the fork's commit).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from harness_rows import row, rows

from envs.registry import load_dataset
from envs.swe.harnesses.swebench import END, START, harness, swe_gym_eval_script, swebench_eval_script
from envs.swe.loaders import DatasetFormatError
from envs.swe.payload import payload_to_spec, task_to_payload
from fleet.config.env import DatasetConfig

ROOT = Path(__file__).resolve().parents[3]
SWEBENCH_41 = ROOT / ".venv" / "opt" / "swebench-4.1"
HERE = Path(__file__).parent
_REFERENCE = """
import json, sys
import swebench
assert swebench.__version__ == "4.1.0", swebench.__version__
import swebench.harness.test_spec.test_spec as ts
ts.make_env_script_list = lambda *a, **k: []  # the env script fetches requirements from GitHub; not compared
out = {}
for r in json.load(sys.stdin):
    try:
        out[r["instance_id"]] = ts.make_test_spec(r).eval_script
    except Exception as exc:
        out[r["instance_id"]] = {"error": repr(exc)}
json.dump(out, sys.stdout)
"""


def _swebench_41(rows_in: list[dict[str, Any]]) -> dict[str, Any]:
    assert (SWEBENCH_41 / "swebench").is_dir(), f"{SWEBENCH_41} missing: `make setup` installs swebench 4.1 there"
    done = subprocess.run([sys.executable, "-c", _REFERENCE], input=json.dumps(rows_in), capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(SWEBENCH_41)}, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _load(tmp_path: Path, name: str, rows_in: list[dict[str, Any]]) -> list[Any]:
    path = tmp_path / "test.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows_in))
    return list(load_dataset(DatasetConfig(dataset_name=name, data_path=str(path))))


def test_eval_script_is_swebench_4_1s_byte_for_byte_for_every_repo_and_version() -> None:
    all_rows = rows(harness("swebench_4_1"))
    reference = _swebench_41(all_rows)
    gradable = [r for r in all_rows if isinstance(reference[r["instance_id"]], str)]
    assert len(gradable) > 600  # every Python, JS and other-language repo version 4.1 can grade
    differ = [r["instance_id"] for r in gradable if swebench_eval_script(r) != reference[r["instance_id"]]]
    assert differ == []


def test_repo_versions_swebench_4_1_cannot_grade_are_refused_with_a_count(tmp_path: Path) -> None:
    all_rows = rows(harness("swebench_4_1"))
    reference = _swebench_41(all_rows)
    broken = [r for r in all_rows if not isinstance(reference[r["instance_id"]], str)]
    assert broken, "swebench 4.1 has versions without a test command (dbt-core)"
    with pytest.raises(DatasetFormatError) as err:
        _load(tmp_path, "swebench", broken)
    assert f"{len(broken)} row(s) cannot be graded yet" in str(err.value)
    assert "dbt-labs/dbt-core" in str(err.value)


def test_a_row_of_an_unknown_repo_or_version_is_refused_not_given_a_guessed_script(tmp_path: Path) -> None:
    unknown = [row("acme/widgets", "1.0", "py"), row("acme/widgets", "1.0", "py") | {"instance_id": "acme__w-2"},
               row("django/django", "0.1", "py")]
    with pytest.raises(DatasetFormatError) as err:
        _load(tmp_path, "swebench", unknown)
    text = str(err.value)
    assert "3 row(s) cannot be graded yet" in text
    assert "2 row(s) of repo acme/widgets" in text
    assert "1 row(s) of repo django/django version 0.1" in text and "known: 1.10, 1.11" in text


def test_swe_gym_eval_script_is_the_forks_with_swebenchs_markers() -> None:
    recorded = json.loads((HERE / "data" / "swe_gym_fork_eval_scripts.json").read_text())
    assert harness("swe_gym_fork")["source"] == recorded["source"]
    checked = 0
    for r in rows(harness("swe_gym_fork")):
        expected = recorded["sha256"][r["instance_id"]]
        if not isinstance(expected, str):
            continue
        ours = swe_gym_eval_script(r).replace(f": '{START}'\n", "").replace(f": '{END}'\n", "")
        assert hashlib.sha256(ours.encode()).hexdigest() == expected, r["instance_id"]
        checked += 1
    assert checked > 750
    for iid, script in recorded["examples"].items():
        assert iid.startswith("python__mypy") and ' -k "testAdded or ' in script  # mypy selects its cases


def test_every_parser_a_harness_names_is_in_the_sandboxs_registry() -> None:
    from services.sandbox.images import contract, parsers

    contract.load()
    names = {*harness("swebench_4_1")["parser"].values(), *harness("swe_gym_fork")["parser"].values()}
    assert [n for n in sorted(names) if not parsers.known(n)] == []


def _log(command: str, body: str, code: int) -> str:
    """An eval log as the sandbox captures it: `set -x` traces on the merged stream, the exit code after the end."""
    return (f"+ git apply -v -\nChecking patch tests.\nApplied patch tests cleanly.\n+ : '{START}'\n+ {command}\n"
            f"{body}\n+ SWEBENCH_TEST_EXIT_CODE={code}\n+ : '{END}'\n+ echo '>>>>> Test Exit Code: {code}'\n"
            f">>>>> Test Exit Code: {code}\n+ git checkout 0123 tests\n")


DJANGO_F2P = ["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)",
              "test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests)"]
DJANGO_P2P = ["test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)"]
DJANGO_LOG = """Testing against Django installed in '/testbed/django'
Importing application auth_tests
Skipping setup of unused database(s): other.
Operations to perform:
  Synchronize unmigrated apps: auth, auth_tests, contenttypes, messages, sessions, staticfiles
Running migrations:
  Applying admin.0001_initial... OK
System check identified no issues (0 silenced).
test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests) ... {a}
test_unicode_validator (auth_tests.test_validators.UsernameValidatorsTests) ... ok
test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest) ... ok

----------------------------------------------------------------------
Ran 3 tests in 0.015s

{summary}"""
SYMPY_LOG = """============================= test process starts ==============================
executable:         /opt/miniconda3/envs/testbed/bin/python  (3.9.19-final-0) [CPython]
architecture:       64-bit
cache:              no
ground types:       python
numpy:              None
random seed:        80196532
hash randomization: on (PYTHONHASHSEED=2371958843)

sympy/core/tests/test_basic.py[3]
test__aresame ok
test_structure ok
test_immutable {a}

================== tests finished: 3 passed, in 0.04 seconds ==================="""
PYTEST_LOG = """============================= test session starts ==============================
platform linux -- Python 3.9.20, pytest-7.4.0, pluggy-1.3.0
rootdir: /testbed
collected 2 items

{path} {dots}                                                   [100%]

=========================== short test summary info ============================
{a} {path}::test_fixed
PASSED {path}::test_kept
============================== 2 passed in 0.31s ==============================="""

CASES = [
    # (harness, repo, version, fail_to_pass, pass_to_pass, gold log body, broken log body)
    ("swebench", "django/django", "3.0", DJANGO_F2P, DJANGO_P2P, DJANGO_LOG.format(a="ok", summary="OK"),
     DJANGO_LOG.format(a="FAIL", summary="FAILED (failures=1)")),
    ("swebench", "sympy/sympy", "1.7", ["test_immutable"], ["test__aresame", "test_structure"],
     SYMPY_LOG.format(a="ok"), SYMPY_LOG.format(a="F")),
    ("swebench", "astropy/astropy", "4.3", ["astropy/io/tests/test_core.py::test_fixed"],
     ["astropy/io/tests/test_core.py::test_kept"],
     PYTEST_LOG.format(path="astropy/io/tests/test_core.py", dots="..", a="PASSED"),
     PYTEST_LOG.format(path="astropy/io/tests/test_core.py", dots="F.", a="FAILED")),
    ("swebench", "psf/requests", "2.0", ["tests/test_requests.py::test_fixed"], ["tests/test_requests.py::test_kept"],
     PYTEST_LOG.format(path="tests/test_requests.py", dots="..", a="PASSED"),
     PYTEST_LOG.format(path="tests/test_requests.py", dots="F.", a="FAILED")),
    ("swe_gym", "pydantic/pydantic", "2.7", ["tests/test_main.py::test_fixed"], ["tests/test_main.py::test_kept"],
     PYTEST_LOG.format(path="tests/test_main.py", dots="..", a="PASSED"),
     PYTEST_LOG.format(path="tests/test_main.py", dots="F.", a="FAILED")),
    ("swe_gym", "python/mypy", "1.9", ["mypy/test/testcheck.py::TypeCheckSuite::check-classes.test::testAdded"],
     [], PYTEST_LOG.format(path="mypy/test/testcheck.py::TypeCheckSuite::check-classes.test", dots=".",
                           a="PASSED").replace("::test_fixed", "::testAdded"),
     PYTEST_LOG.format(path="mypy/test/testcheck.py::TypeCheckSuite::check-classes.test", dots="F",
                       a="FAILED").replace("::test_fixed", "::testAdded")),
]


@pytest.mark.parametrize("name,repo,version,f2p,p2p,gold,broken", CASES, ids=[c[1] for c in CASES])
def test_the_harnesss_gold_run_log_grades_full_and_a_failing_one_does_not(
        name: str, repo: str, version: str, f2p: list[str], p2p: list[str], gold: str, broken: str,
        tmp_path: Path) -> None:
    from services.sandbox.images import contract

    r = row(repo, version, "py") | {"FAIL_TO_PASS": json.dumps(f2p), "PASS_TO_PASS": json.dumps(p2p)}
    [task] = _load(tmp_path, name, [r])
    spec = payload_to_spec(task_to_payload(task), task.patch)
    assert spec.eval_script is not None and spec.log_parser == harness(
        "swe_gym_fork" if name == "swe_gym" else "swebench_4_1")["parser"][repo.lower() if name == "swe_gym" else repo]
    command = next(line for line in spec.eval_script.splitlines() if line.startswith(tuple("./pPb")) and
                   ("test" in line or "pytest" in line) and "pip" not in line)
    ts = contract.test_spec(spec, [])
    assert contract.grade(spec, ts, _log(command, gold, 0)).resolution == "FULL"
    assert contract.grade(spec, ts, _log(command, broken, 1)).resolution != "FULL"


def test_the_payload_carries_the_eval_script_and_the_fixs_files_but_never_the_gold_patch(tmp_path: Path) -> None:
    [task] = _load(tmp_path, "swebench", [row("django/django", "3.0", "py")])
    payload = task_to_payload(task)
    assert "patch" not in payload and task.patch not in json.dumps(payload)
    assert payload["task_paths"] == ["src/core.py"]  # code under test for the integrity check, whatever its name
    assert payload["log_parser"] == "parse_log_django"
    assert "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests" in payload["eval_script"]
