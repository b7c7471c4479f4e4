import os
import subprocess
import sys
from pathlib import Path

from launch.data.statement import parse_failures, write_statement

OUTPUT = """\
....F..F
=================================== FAILURES ===================================
_________________________________ test_merge __________________________________
pkg/tests/test_dicts.py:30: in test_merge
    assert merge({1: 2}, {1: 3}) == {1: 3}
pkg/dicts.py:40: in merge
    rv.update(d) if d is not rv else None
E   AssertionError: assert {1: 2} == {1: 3}
E     Differing items:
----------------------------- Captured stdout call -----------------------------
noise that must not appear
_ TestX.test_keys[a very long parametrised id that leaves pytest no room for more underscores] _
pkg/tests/test_dicts.py:51: in test_keys
    assert keys(d) == ["a"]
pkg/dicts.py:12: in keys
    return list(reversed(d))
E   TypeError: 'dict' object is not reversible
=========================== short test summary info ============================
FAILED pkg/tests/test_dicts.py::test_merge - AssertionError: assert {1: 2} == {1: 3}
FAILED pkg/tests/test_dicts.py::TestX::test_keys[a b] - TypeError
2 failed, 6 passed in 0.12s
"""


def test_library_frames_and_captured_output_are_dropped():
    excerpts = parse_failures(OUTPUT, ("pkg/tests",))
    assert [e.title for e in excerpts] == [
        "test_merge", "TestX.test_keys[a very long parametrised id that leaves pytest no room for more underscores]"]
    text = "\n".join(e.render() for e in excerpts)
    assert "pkg/tests/test_dicts.py:30: in test_merge" in text
    assert "E   AssertionError: assert {1: 2} == {1: 3}" in text
    assert "pkg/dicts.py" not in text and "rv.update" not in text  # would point at the changed line
    assert "noise" not in text


def test_statement_lists_failing_tests_and_never_the_library_code():
    failing = [f"pkg/tests/test_dicts.py::test_{i}" for i in range(14)]
    s = write_statement("pkg__op_change__abc", "pkg", "1.0", failing, OUTPUT, ("pkg/tests",))
    assert "These 14 tests fail:" in s
    assert "`pkg/tests/test_dicts.py::test_0`" in s and "... and 4 more" in s
    assert "TypeError: 'dict' object is not reversible" in s
    assert "reversed(d)" not in s
    assert s == write_statement("pkg__op_change__abc", "pkg", "1.0", failing, OUTPUT, ("pkg/tests",))


def test_statement_without_parsable_output_still_names_the_test():
    s = write_statement("x", "pkg", "1.0", ["t.py::test_a"], "", ("t.py",))
    assert "This test fails:\n- `t.py::test_a`" in s


LIBRARY = '''\
import json


def load(text):
    return parse(text)


def parse(text):
    return step(json.loads(text), 5)


def step(value, depth):
    if depth == 0:
        return value + 1
    return step(value, depth - 1)
'''
TESTS = '''\
from pkg.lib import load


def test_load():
    assert load('"a"') == "b"
'''


def real_pytest_output(tmp_path: Path) -> str:
    """pytest's own output (the builder's arguments) for a bug raising five frames deep inside a package."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "lib.py").write_text(LIBRARY)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_lib.py").write_text(TESTS)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q", "-rfE",
                          "--tb=short", "tests"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert run.returncode == 1, run.stdout + run.stderr
    return run.stdout


def test_library_frames_show_where_the_tests_entered_the_library_and_where_it_raised(tmp_path):
    output = real_pytest_output(tmp_path)
    s = write_statement("pkg__x", "pkg", "1.0", ["tests/test_lib.py::test_load"], output, ("tests",),
                        library_frames=True)
    assert "tests/test_lib.py:5: in test_load" in s
    assert "pkg/lib.py:5: in load" in s and "pkg/lib.py:9: in parse" in s  # the outermost two
    assert "pkg/lib.py:14: in step" in s and "return value + 1" in s  # the innermost: where it raised
    assert "more frames ...]" in s  # the recursion between them, counted
    assert s.count("pkg/lib.py:15: in step") == 1 and "[... 4 more frames ...]" in s
    assert "^^^" not in s and "~~~" not in s
    assert "TypeError" in s


def test_without_library_frames_the_real_traceback_keeps_only_the_test(tmp_path):
    s = write_statement("pkg__x", "pkg", "1.0", ["tests/test_lib.py::test_load"], real_pytest_output(tmp_path),
                        ("tests",))
    assert "tests/test_lib.py:5: in test_load" in s and "TypeError" in s
    assert "pkg/lib.py" not in s and "value + 1" not in s


def test_frames_outside_the_checkout_are_never_shown():
    output = OUTPUT.replace("pkg/dicts.py:12: in keys", "/usr/lib/python3.11/json/decoder.py:12: in keys")
    text = "\n".join(e.render() for e in parse_failures(output, ("pkg/tests",), library_frames=True))
    assert "pkg/dicts.py:40: in merge" in text and "rv.update(d)" in text
    assert "/usr/lib" not in text and "reversed(d)" not in text


def test_default_statements_are_written_as_before_markers_and_all(tmp_path):
    """Sets built before `statement_frames` existed must rebuild to the same rows: the default keeps every line of
    the test frames, Python's position markers included."""
    s = write_statement("pkg__x", "pkg", "1.0", ["tests/test_lib.py::test_load"], real_pytest_output(tmp_path),
                        ("tests",))
    assert "    assert load('\"a\"') == \"b\"\n           ^^^^^^^^^^^\nE   TypeError" in s
