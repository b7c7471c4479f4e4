"""Grading: pytest's `--junitxml` -> a status map keyed by pytest node ids -> swebench's resolution.

Why junit and not the console log: swebench's pytest log parser splits lines on whitespace, so a parametrised id
with a space (`test_mul[two three]`) is lost. junit keeps every test but stores `classname` + `name` instead of the
node id; pytest derives them from the node id with a fixed mangling (`_pytest.junitxml.mangle_test_address`), so an
expected id is found by mangling it the same way: exact, for every id the task grades. Other test cases are turned
back into node ids from the `file` attribute (xunit1), or by finding the module file in the tree.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from fleet.contracts.sandbox import ResolutionName

PASSING = frozenset({"PASSED", "XFAIL", "XPASS"})
FAILING = frozenset({"FAILED", "ERROR"})
_RANK = {"PASSED": 0, "XFAIL": 1, "SKIPPED": 2, "FAILED": 3, "ERROR": 4}
# As _pytest.junitxml.bin_xml_escape (DEL included), so that names match what pytest wrote.
_ILLEGAL_XML = re.compile("[^\u0009\u000a\u000d\u0020-\u007e\u0080-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def _xml_escape(text: str) -> str:
    return _ILLEGAL_XML.sub(lambda m: f"#x{ord(m.group()):02X}" if ord(m.group()) <= 0xFF
                            else f"#x{ord(m.group()):04X}", text)


def _dotted(path: str) -> str:
    return re.sub(r"\.py$", "", path.replace("/", "."))


def junit_key(nodeid: str) -> tuple[str, str]:
    """(classname, name) that pytest's junit writer gives `nodeid`."""
    path, sep, tail = nodeid.partition("::")
    if not sep:
        names = [path]
    else:
        name_part, bracket, params = tail.partition("[")
        names = [path, *name_part.split("::")]
        names[-1] += bracket + params
    names[0] = _dotted(names[0])
    return ".".join(names[:-1]), _xml_escape(names[-1])


def _case_status(case: ET.Element) -> str:
    tags = {child.tag: child for child in case}
    if "failure" in tags:
        return "FAILED"
    if "error" in tags:
        return "ERROR"
    skipped = tags.get("skipped")
    if skipped is not None:
        return "XFAIL" if skipped.get("type") == "pytest.xfail" else "SKIPPED"
    return "PASSED"


def _recover_nodeid(classname: str, name: str, file: str | None, tree: Path | None) -> str:
    if file:
        dotted = _dotted(file)
        if classname == "" and name == dotted:  # a collection error of the whole module
            return file
        if classname == dotted:
            return f"{file}::{name}"
        if classname.startswith(dotted + "."):
            return "::".join([file, *classname[len(dotted) + 1:].split("."), name])
    parts = classname.split(".") if classname else []
    if tree is not None:
        # An inherited test reports the base class's file: find the module the class path starts with.
        for i in range(len(parts), 0, -1):
            candidate = "/".join(parts[:i]) + ".py"
            if (tree / candidate).is_file():
                return "::".join([candidate, *parts[i:], name])
    return f"{classname}::{name}" if classname else name


def parse_junit(data: bytes, expected: Iterable[str] = (), tree: Path | None = None) -> dict[str, str]:
    """Status map {node id: PASSED|FAILED|ERROR|SKIPPED|XFAIL}; the worst status wins for a repeated id."""
    if not data.strip():
        return {}
    # The file is written inside the sandbox, so it is untrusted: expat >= 2.4 (pyexpat.EXPAT_VERSION) refuses
    # entity-expansion bombs, and ElementTree never fetches external entities.
    root = ET.fromstring(data)
    by_key = {junit_key(t): t for t in expected}
    status: dict[str, str] = {}
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        nodeid = by_key.get((classname, name)) or _recover_nodeid(classname, name, case.get("file"), tree)
        new = _case_status(case)
        old = status.get(nodeid)
        if old is None or _RANK[new] > _RANK[old]:
            status[nodeid] = new
    return status


def count(status: dict[str, str]) -> tuple[int, int]:
    """(passed, failed) over every test that ran."""
    values = list(status.values())
    return sum(v in PASSING for v in values), sum(v in FAILING for v in values)


@cache
def _swebench() -> Any:
    # Imported on first use (or by Executor.start): swebench pulls in docker/datasets, ~1.5 s.
    from swebench.harness import grading
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS

    return grading, FAIL_TO_PASS, PASS_TO_PASS


def load_grader() -> None:
    _swebench()


def grade(
    status: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]
) -> tuple[ResolutionName, dict[str, dict[str, list[str]]]]:
    """swebench's resolution (FULL / PARTIAL / NO) and its tests report."""
    grading, f2p_key, p2p_key = _swebench()
    gold = {f2p_key: list(fail_to_pass), p2p_key: list(pass_to_pass)}
    report = grading.get_eval_tests_report(status, gold)
    resolution = grading.get_resolution_status(report).removeprefix("RESOLVED_")
    if resolution not in ("FULL", "PARTIAL", "NO"):
        raise ValueError(f"unexpected swebench resolution {resolution!r}")
    kept = {k: v for k, v in report.items() if k in (f2p_key, p2p_key)}
    return resolution, kept


def strict_status(status: dict[str, str], fail_to_pass: Iterable[str]) -> dict[str, str]:
    """The status map swebench grades: a FAIL_TO_PASS test must PASS, so its XFAIL or XPASS (an expected failure
    the patch or the code under test arranged) is a FAILED; elsewhere an XPASS is a pass (swebench has no XPASS)."""
    f2p = set(fail_to_pass)
    out: dict[str, str] = {}
    for nodeid, value in status.items():
        if nodeid in f2p and value in ("XFAIL", "XPASS"):
            out[nodeid] = "FAILED"
        else:
            out[nodeid] = "PASSED" if value == "XPASS" else value
    return out
