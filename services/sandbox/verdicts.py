"""From one finished test run to its verdict: the report stream checked, the outcome graded, every reason to
disbelieve it turned into `integrity_violation`.

The verdict needs the runner's signed report and the process's exit status to agree (`report.disagreements`); a
report that does not verify, a run that exited 0 before pytest finished, an outcome manipulated in process (the
runner's end-of-run checks) are violations. FAIL_TO_PASS is graded strictly (`grading.strict_status`: XFAIL and XPASS
are not passes). Shared by every runtime that runs the trusted runner: `grade_run(spec, result, key, ...)`.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from fleet.contracts.sandbox import TaskSpec, TaskStatus, Verdict
from services.sandbox import grading
from services.sandbox.cgroups import TaskStats
from services.sandbox.process import RunResult
from services.sandbox.report import FAILING, RunReport, disagreements, read_report

_CPU = (-signal.SIGXCPU, 128 + signal.SIGXCPU)
_KILLED = (-signal.SIGKILL, 128 + signal.SIGKILL)


@dataclass(frozen=True)
class Limits:
    """What the verdict's notes quote, and the verdict's own bounds."""

    cpu_s: int
    memory_mb: int
    task_memory_mb: int | None
    max_test_cases: int


def _read(spec: TaskSpec, result: RunResult, key: bytes | None, limits: Limits, killed: bool, shell: bool,
          notes: list[str]) -> tuple[RunReport | None, list[str]]:
    expected = [*spec.fail_to_pass, *spec.pass_to_pass]
    if key is None or result.report is None:
        return None, []
    data = bytes(result.report.data)
    if killed and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]  # a run killed mid-write: its last record is cut, not forged
    rep = read_report(data, key, max_cases=limits.max_test_cases, expected=frozenset(expected),
                      overflow=result.report.overflow)
    violations = list(rep.violations)
    if not killed:
        violations += disagreements(rep, result.exit_code, shell=shell)
    if rep.exit_status is None:
        # The runner's end-of-run checks (hooks, pytest internals, skips and xfails from code under test) never ran:
        # a patch that rigs the outcomes and then kills its own process must gain nothing, so no pass counts.
        passing = [t for t, s in rep.status.items() if s not in FAILING]
        rep.status = {t: s for t, s in rep.status.items() if s in FAILING}
        if (expected or passing) and not violations:
            notes.append("pytest did not run to the end" + (f": without its end-of-run checks the {len(passing)} "
                                                             "tests it reported passing do not count" if passing
                                                             else ""))
    if rep.unfinished:
        notes.append(f"the test process died inside {', '.join(rep.unfinished[:5])} (counted as failed)")
    if rep.truncated:
        notes.append(f"{rep.truncated} more test cases ran than a verdict lists ({limits.max_test_cases})")
    return rep, violations


def grade_run(spec: TaskSpec, result: RunResult, key: bytes | None, limits: Limits,
              cgroup: TaskStats | None = None, *, shell: bool = False) -> Verdict:
    """The verdict of a finished run; `key` None: the run produced no report (graded by exit status), `shell`: a shell
    command around pytest (see `report.disagreements`)."""
    notes: list[str] = []
    code = result.exit_code
    status_name: TaskStatus = "completed"
    killed = result.timed_out or code in (*_CPU, *_KILLED)
    if result.timed_out:
        status_name = "timeout"
        notes.append(f"tests ran past the {spec.timeout:g} s limit and were killed")
    elif code in (*_CPU, *_KILLED):
        status_name = "timeout" if code in _CPU else "completed"
        task_mem = f", task memory {limits.task_memory_mb} MB" if limits.task_memory_mb else ""
        notes.append(f"killed by a resource limit (exit {code}: cpu {limits.cpu_s} s / memory {limits.memory_mb} MB"
                     f"{task_mem})")
    if cgroup is not None and cgroup.memory_limit_hit:
        notes.append(f"the task reached its memory limit (peak {cgroup.memory_peak_mb:g} MB)")
    if cgroup is not None and cgroup.pids_limit_hit:
        notes.append("the task reached its process limit")
    rep, violations = _read(spec, result, key, limits, killed, shell, notes)
    status = rep.status if rep else {}
    expected = [*spec.fail_to_pass, *spec.pass_to_pass]
    report: dict[str, dict[str, list[str]]] = {}
    if expected:
        resolution, report = grading.grade(grading.strict_status(status, spec.fail_to_pass), spec.fail_to_pass,
                                           spec.pass_to_pass)
    else:
        resolution = "FULL" if code == 0 else "NO"
    if violations:
        status_name, resolution = "integrity_violation", "NO"
        notes.insert(0, "integrity violation: " + "; ".join(violations[:10]))
    elif status_name == "timeout":
        resolution = "NO"
    elif cgroup is not None and cgroup.memory_limit_hit:
        # Past the task's memory, cgroup v2 and the watchdog kill the whole run, cgroup v1 only its largest process
        # (the rest may still pass): NO on every host, so the same answer never scores differently by kernel.
        resolution = "NO"
    passed, failed = grading.count(status)
    return Verdict(
        status=status_name, patch_applied=True, test_patch_applied=True, tests_passed=passed,
        tests_failed=failed, exit_code=code, test_status=status, resolution=resolution,
        stdout_tail=result.stdout.text(), stderr_tail=result.stderr.text(), error="; ".join(notes),
        report=report, stdout_bytes=result.stdout.total, stderr_bytes=result.stderr.total)


FIRST_RUN_NOTE = "the FAIL_TO_PASS tests ran alone first and none passed: PASS_TO_PASS not run (fail_to_pass_first)"


def no_failing_test_passed(first: Verdict, spec: TaskSpec) -> bool:
    """Whether a run of `spec`'s FAIL_TO_PASS tests alone settles its verdict (`TaskSpec.fail_to_pass_first`): it
    ran past its time limit (the full run, a superset, would too), or it completed with every one of them reported
    and none passing (strictly: XFAIL and XPASS are no passes). Anything else, an integrity violation included, is
    left to the full run."""
    if first.status == "timeout":
        return True
    return (first.status == "completed" and all(t in first.test_status for t in spec.fail_to_pass)
            and not first.report.get("FAIL_TO_PASS", {}).get("success"))

