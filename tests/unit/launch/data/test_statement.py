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
