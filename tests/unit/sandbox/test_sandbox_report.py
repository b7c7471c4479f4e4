"""The trusted runner's report stream as the executor reads it, strict grading, the task-set command form, and the
reward of an integrity violation."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.contracts.sandbox import TaskSpec, Verdict
from sandbox_client import reward_from_verdict
from services.sandbox.grading import strict_status
from services.sandbox.report import disagreements, read_report
from services.sandbox.runner import protocol
from services.sandbox.runner.testpaths import is_protected
from services.sandbox.trusted import TrustedRunner, pytest_command

KEY = b"k" * protocol.KEY_BYTES


def _stream(*records: dict[str, object], key: bytes = KEY) -> bytes:
    return b"".join(protocol.encode(key, i, r) for i, r in enumerate(records))


START = {"k": "start", "pytest": "9", "pid": 1}


def _t(nodeid: str, when: str, outcome: str, xfail: bool = False) -> dict[str, object]:
    return {"k": "t", "id": nodeid, "w": when, "o": outcome, "x": xfail}


def test_phases_fold_into_one_status_per_test() -> None:
    data = _stream(START, _t("a", "setup", "passed"), _t("a", "call", "passed"), _t("a", "teardown", "failed"),
                   _t("b", "setup", "passed"), _t("b", "call", "skipped", xfail=True), _t("c", "setup", "skipped"),
                   _t("d", "setup", "passed"), _t("d", "call", "passed", xfail=True), {"k": "collect", "id": "e.py"},
                   {"k": "end", "exit": 1, "v": []})
    rep = read_report(data, KEY, max_cases=100)
    assert rep.status == {"a": "ERROR", "b": "XFAIL", "c": "SKIPPED", "d": "XPASS", "e.py": "ERROR"}
    assert (rep.exit_status, rep.violations, rep.sessions) == (1, [], 1)
    assert disagreements(rep, 1) == []


def test_a_test_whose_process_died_in_its_call_phase_failed_even_though_its_setup_passed() -> None:
    # A patch that SIGKILLs or segfaults the test process inside the last failing test kept the setup's PASSED.
    data = _stream(START, _t("a", "setup", "passed"), _t("a", "call", "passed"), _t("a", "teardown", "passed"),
                   _t("b", "setup", "passed"))
    rep = read_report(data, KEY, max_cases=100)
    assert rep.status == {"a": "PASSED", "b": "FAILED"}
    assert rep.unfinished == ["b"]


@pytest.mark.parametrize("line", [b"0\tdeadbeef\t{\"k\":\"end\",\"exit\":0,\"v\":[]}\n", b"garbage\n"])
def test_a_line_the_runner_did_not_sign_is_a_violation(line: bytes) -> None:
    rep = read_report(_stream(START) + line, KEY, max_cases=100)
    assert rep.violations and rep.violations[0].startswith("report stream:")


def test_another_key_replayed_or_reordered_records_are_violations() -> None:
    assert read_report(_stream(START, key=b"x" * 32), KEY, max_cases=10).violations
    a, b = _stream(START, _t("a", "call", "passed")).splitlines(keepends=True)
    assert "was due" in read_report(b + a, KEY, max_cases=10).violations[0]


def test_duplicates_second_sessions_and_records_after_the_end_are_violations() -> None:
    dup = read_report(_stream(START, _t("a", "call", "failed"), _t("a", "call", "passed")), KEY, max_cases=10)
    assert "reported twice" in dup.violations[0]
    two = read_report(_stream(START, START), KEY, max_cases=10)
    assert "more than one pytest session" in two.violations[0]
    late = read_report(_stream(START, {"k": "end", "exit": 0, "v": []}, _t("a", "call", "passed")), KEY,
                       max_cases=10)
    assert "after the final one" in late.violations[0]


def test_exit_status_and_report_must_agree() -> None:
    ok_end = {"k": "end", "exit": 0, "v": []}
    passed = read_report(_stream(START, _t("a", "call", "passed"), ok_end), KEY, max_cases=10)
    assert disagreements(passed, 0) == []
    assert "process exited 1" in disagreements(passed, 1)[0]
    unfinished = read_report(_stream(START, _t("a", "call", "passed")), KEY, max_cases=10)
    assert "never finished" in disagreements(unfinished, 0)[0]
    assert disagreements(unfinished, 1) == []  # a crash: not run to the end, no reward either way
    lying = read_report(_stream(START, _t("a", "call", "failed"), ok_end), KEY, max_cases=10)
    assert "exited 0 with failing tests" in disagreements(lying, 0)[0]
    # A shell around pytest may exit differently from it; a shell that ran no pytest at all says nothing.
    assert disagreements(passed, 1, shell=True) == []
    assert disagreements(read_report(b"", KEY, max_cases=10), 0, shell=True) == []


def test_violations_from_the_runner_itself_are_kept_and_the_verdict_is_capped() -> None:
    records = [START, *(_t(f"t{i}", "setup", "passed") for i in range(300)), _t("want", "call", "passed"),
               {"k": "end", "exit": 0, "v": ["hook x was changed"]}]
    rep = read_report(_stream(*records), KEY, max_cases=100, expected=frozenset({"want"}))
    assert len(rep.status) == 101 and rep.status["want"] == "PASSED" and rep.truncated == 200
    assert rep.violations == ["hook x was changed"]
    assert "longer than" in read_report(_stream(START), KEY, max_cases=10, overflow=True).violations[0]


def test_fail_to_pass_is_strict_about_xfail_and_xpass() -> None:
    status = {"f1": "XFAIL", "f2": "XPASS", "f3": "PASSED", "p1": "XFAIL", "p2": "XPASS"}
    assert strict_status(status, ["f1", "f2", "f3"]) == {"f1": "FAILED", "f2": "FAILED", "f3": "PASSED",
                                                        "p1": "XFAIL", "p2": "PASSED"}


@pytest.mark.parametrize(("command", "paths", "args"), [
    ("PYTHONHASHSEED=0 PYTHONPATH=src:_vendor python -m pytest -q tests", ["src", "_vendor"], ["-q", "tests"]),
    ("python3 -m pytest 'tests/test a.py'", [], ["tests/test a.py"]),
])
def test_the_task_set_command_form_is_recognised(command: str, paths: list[str], args: list[str]) -> None:
    parsed = pytest_command(command)
    assert parsed is not None and (parsed.paths, parsed.args) == (paths, args)


@pytest.mark.parametrize(("command", "pytest_args"), [
    ("python -m pytest -q -rfE --tb=short tests/a.py", ["-q", "-rfE", "--tb=short", "tests/a.py", "--tb=no"]),
    ("python -m pytest --tb=long -- tests/a.py", ["--tb=long", "--tb=no", "--", "tests/a.py"]),
    (None, ["-p", "no:cacheprovider", "-q", "-rfE", "--tb=short", "tests/a.py", "--tb=no"]),
])
def test_a_first_run_without_tracebacks_has_the_last_tb_option(command: str | None, pytest_args: list[str]) -> None:
    """pytest takes the last `--tb`, and after `--` reads paths only: `--tb=no` goes after the command's options."""
    runner = TrustedRunner(Path("/runner"), "/usr/bin/python3", True, frozenset())
    spec = TaskSpec(repo_url="r", base_commit="c", patch="", test_command=command,
                    fail_to_pass=["tests/a.py::test_x"], pass_to_pass=["tests/a.py::test_y"])

    def args(**kw: object) -> list[str]:
        argv, _ = runner.test_command(spec, Path("/tree"), 3, 4, disable_autoload=True, **kw)  # type: ignore[arg-type]
        return argv[argv.index("--") + 1:]

    assert args(only=["tests/a.py::test_x"], tracebacks=False) == pytest_args
    assert "--tb=no" not in args(only=["tests/a.py::test_x"], tracebacks=True)
    assert "--tb=no" not in args(tracebacks=False)  # the full run keeps the task's command


@pytest.mark.parametrize("command", ["sleep 1 && python -m pytest", "python -m pytest; echo $?", "pytest tests",
                                     "python -m pytest > out", "python setup.py test", "python -m pytest 'x"])
def test_other_shell_commands_are_not(command: str) -> None:
    assert pytest_command(command) is None


@pytest.mark.parametrize("path", ["pytest.toml", "sub/.pytest.toml", "tox.ini", "pkg/setup.cfg", "x.pth", "tests",
                                  "pkg/conftest.py", "sitecustomize.py", "tests/helpers.py"])
def test_runner_inputs_are_restored_to_pristine(path: str) -> None:
    assert is_protected(path)


def test_an_integrity_violation_costs_the_configured_reward() -> None:
    caught = Verdict(status="integrity_violation", patch_applied=True, resolution="NO")
    assert reward_from_verdict(caught, "binary") == -1.0
    assert reward_from_verdict(caught, "pass_rate", integrity_violation_reward=-0.25) == -0.25


def test_the_fast_test_record_is_the_same_json() -> None:
    line = protocol.encode_payload(KEY, 0, protocol.test_payload('t["a\\"b"]', "call", "passed", True))
    assert protocol.decode(KEY, 0, line) == {"k": "t", "id": 't["a\\"b"]', "w": "call", "o": "passed", "x": True}
