"""The executor's reading of the trusted runner's report stream (`runner/protocol.py`): outcomes per node id, and
every reason not to believe them.

Reusable by any runtime that starts the runner (the host runtime in `executor.py`; an image runtime binds the same
runner folder into the image): `read_report(data, key)` then `disagreements(report, exit_code)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.sandbox.runner import protocol

# Worst wins when phases disagree: a failing teardown makes a passed test an ERROR, as junit does.
_RANK = {"PASSED": 0, "XPASS": 1, "XFAIL": 2, "SKIPPED": 3, "FAILED": 4, "ERROR": 5}
FAILING = frozenset({"FAILED", "ERROR"})


@dataclass
class RunReport:
    status: dict[str, str] = field(default_factory=dict)
    """node id -> PASSED | FAILED | ERROR | SKIPPED | XFAIL | XPASS."""
    exit_status: int | None = None
    """pytest's own exit status, from its final record (None: pytest did not finish)."""
    violations: list[str] = field(default_factory=list)
    sessions: int = 0
    records: int = 0
    truncated: int = 0
    """Test cases beyond `max_cases` that were counted, not kept."""
    unfinished: list[str] = field(default_factory=list)
    """Tests whose setup passed but whose call phase never reported: the process died inside them (FAILED)."""


def _phase_status(when: str, outcome: str, xfail: bool) -> str:
    if outcome == "failed":
        return "FAILED" if when in ("call", "subtest") else "ERROR"
    if outcome == "skipped":
        return "XFAIL" if xfail else "SKIPPED"
    return "XPASS" if xfail else "PASSED"


def read_report(data: bytes, key: bytes, *, max_cases: int, expected: frozenset[str] = frozenset(),
                overflow: bool = False) -> RunReport:
    """Verify and fold the stream. `overflow`: the stream was longer than the executor keeps (a violation)."""
    report = RunReport()
    seen: set[tuple[str, str]] = set()
    started: set[str] = set()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    elif lines:
        report.violations.append("the report stream ends in the middle of a record")
        lines.pop()
    for record in _records(lines, key, report):
        report.records += 1
        if report.exit_status is not None:
            report.violations.append("report stream: records after the final one")
            break
        _fold(report, record, seen, started, max_cases, expected)
    # A passed setup is only a start: a test that killed its own process (SIGKILL, a segfault, os._exit) in its call
    # phase must not keep the setup's pass.
    report.unfinished = sorted(started)
    for nodeid in report.unfinished:
        report.status[nodeid] = "FAILED"
    if overflow:
        report.violations.append("report stream: longer than the executor accepts")
    return report


def _records(lines: list[bytes], key: bytes, report: RunReport) -> list[dict[str, object]]:
    """The records up to the first line that does not verify or parse (that line's reason goes to `violations`)."""
    payloads: list[str] = []
    for seq, line in enumerate(lines):
        try:
            payloads.append(protocol.verify(key, seq, line))
        except ValueError as exc:
            report.violations.append(f"report stream: {exc}")
            break
    records = protocol.parse_many(payloads)
    if records is not None:
        return list(records)
    records = []
    for seq, payload in enumerate(payloads):
        try:
            records.append(protocol.parse(seq, payload))
        except ValueError as exc:
            report.violations.insert(0, f"report stream: {exc}")  # it comes before any unsigned line after it
            break
    return list(records)


def _fold(report: RunReport, record: dict[str, object], seen: set[tuple[str, str]], started: set[str],
          max_cases: int, expected: frozenset[str]) -> None:
    kind = record["k"]
    if kind == "start":
        report.sessions += 1
        if report.sessions > 1:
            report.violations.append("report stream: more than one pytest session")
    elif kind in ("t", "collect"):
        nodeid, when = str(record.get("id", "")), str(record.get("w", "collect"))
        if (nodeid, when) in seen and when != "subtest":  # a test has any number of subtests, one call phase
            report.violations.append(f"report stream: {nodeid} ({when}) reported twice")
            return
        seen.add((nodeid, when))
        new = "ERROR" if kind == "collect" else _phase_status(when, str(record.get("o")), bool(record.get("x")))
        old = report.status.get(nodeid)
        if old is None and len(report.status) >= max_cases and nodeid not in expected:
            report.truncated += when == "setup"
            return
        if old is None or _RANK[new] > _RANK[old]:  # passing phases rank lowest, so the worst phase decides
            report.status[nodeid] = new
        if when == "setup" and record.get("o") == "passed":
            started.add(nodeid)
        elif when == "call":
            started.discard(nodeid)
    elif kind == "end":
        report.exit_status = int(str(record.get("exit")))
        listed = record.get("v")
        report.violations += [str(v) for v in listed] if isinstance(listed, list) else []
    else:
        report.violations.append(f"report stream: unknown record {kind!r}")


def disagreements(report: RunReport, exit_code: int | None, *, shell: bool = False) -> list[str]:
    """Where the report and the process's exit status contradict each other (each one a violation). `shell`: the
    process is a shell command around pytest, whose exit status need not be pytest's."""
    out: list[str] = []
    if report.sessions == 0 and report.records:
        out.append("report stream: no session start")
    if report.exit_status is None:
        if exit_code == 0 and (report.records or not shell):
            out.append("the test process exited 0 but pytest never finished (exit from code under test?)")
        return out
    if exit_code != report.exit_status and not shell:
        out.append(f"pytest finished with exit status {report.exit_status} but the process exited {exit_code}")
    failing = any(s in FAILING for s in report.status.values())
    if report.exit_status == 0 and failing:
        out.append("pytest exited 0 with failing tests in its report")
    if report.exit_status == 1 and not failing and not report.truncated:
        out.append("pytest reported failures that its report does not hold")
    return out
