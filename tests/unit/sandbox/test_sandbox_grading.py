"""Grading from pytest's junit report is exact for every node id, including spaces and odd parameters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _pytest.junitxml import bin_xml_escape, mangle_test_address
from hypothesis import given
from hypothesis import strategies as st

from services.sandbox.grading import count, grade, junit_key, parse_junit

SUITE = '''\
import pytest


@pytest.mark.parametrize("x", [1, 2], ids=["with space", "a::b [nested]"])
def test_param(x):
    assert x == 1


class TestBox:
    @pytest.mark.parametrize("s", ["é", "tab\\there"])
    def test_text(self, s):
        assert s


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False


@pytest.mark.skip(reason="later")
def test_skipped():
    pass


@pytest.fixture
def broken():
    raise RuntimeError("fixture")


def test_error(broken):
    pass
'''
EXPECTED = {
    "tests/test_suite.py::test_param[with space]": "PASSED",
    "tests/test_suite.py::test_param[a::b [nested]]": "FAILED",
    "tests/test_suite.py::TestBox::test_text[\\xe9]": "PASSED",
    "tests/test_suite.py::TestBox::test_text[tab\\there]": "PASSED",
    "tests/test_suite.py::test_xfail": "XFAIL",
    "tests/test_suite.py::test_skipped": "SKIPPED",
    "tests/test_suite.py::test_error": "ERROR",
}


@pytest.fixture(scope="module")
def junit(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    root = tmp_path_factory.mktemp("suite")
    (root / "tests").mkdir()
    (root / "tests" / "test_suite.py").write_text(SUITE)
    report = root / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={report}",
                    "-o", "junit_family=xunit1", "tests"], cwd=root, capture_output=True, check=False)
    return report.read_bytes(), root


def test_expected_ids_are_found_exactly(junit: tuple[bytes, Path]) -> None:
    data, root = junit
    assert parse_junit(data, EXPECTED, root) == EXPECTED


def test_ids_are_recovered_without_expectations(junit: tuple[bytes, Path]) -> None:
    data, root = junit
    assert parse_junit(data, (), root) == EXPECTED
    assert count(EXPECTED) == (4, 2)


def test_collection_error_is_an_error_of_the_module(tmp_path: Path) -> None:
    (tmp_path / "test_broken.py").write_text("import nothing_here\n")
    report = tmp_path / "j.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--junitxml={report}", "-o",
                    "junit_family=xunit1", "test_broken.py"], cwd=tmp_path, capture_output=True, check=False)
    assert parse_junit(report.read_bytes(), ["test_broken.py::test_x"], tmp_path) == {"test_broken.py": "ERROR"}


_name = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="[]:/"), min_size=1, max_size=12)
_params = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@given(dirs=st.lists(_name.filter(lambda s: s not in (".", "..")), max_size=2), module=_name,
       classes=st.lists(_name, max_size=2), func=_name, params=st.none() | _params)
def test_junit_key_matches_pytests_own_mangling(dirs: list[str], module: str, classes: list[str], func: str,
                                                params: str | None) -> None:
    nodeid = "::".join(["/".join([*dirs, f"test_{module}.py"]), *classes, f"test_{func}"])
    if params is not None:
        nodeid += f"[{params}]"
    names = mangle_test_address(nodeid)
    assert junit_key(nodeid) == (".".join(names[:-1]), bin_xml_escape(names[-1]))


def test_grade_uses_swebench_resolution() -> None:
    f2p, p2p = ["a.py::t[x y]", "a.py::u"], ["a.py::v"]
    status = {"a.py::t[x y]": "PASSED", "a.py::u": "PASSED", "a.py::v": "PASSED"}
    assert grade(status, f2p, p2p)[0] == "FULL"
    assert grade({**status, "a.py::u": "FAILED"}, f2p, p2p)[0] == "PARTIAL"
    assert grade({**status, "a.py::v": "FAILED"}, f2p, p2p)[0] == "NO"
    resolution, report = grade({}, f2p, p2p)
    assert resolution == "NO" and report["FAIL_TO_PASS"]["failure"] == f2p


def test_a_hostile_report_cannot_explode() -> None:
    bomb = ('<?xml version="1.0"?><!DOCTYPE l [<!ENTITY a "aaaaaaaaaa">'
            + "".join(f'<!ENTITY {c} "{("&" + p + ";") * 10}">' for p, c in zip("abcdefgh", "bcdefghi", strict=True))
            + ']><testsuite><testcase classname="x" name="&i;"/></testsuite>')
    with pytest.raises(SyntaxError):
        parse_junit(bomb.encode())
