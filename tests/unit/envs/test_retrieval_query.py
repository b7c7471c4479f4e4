"""`bm25_functions` retrieval reads the tests a statement names (as the builder's failing-test statements list
them) from the checkout and adds their source to the query: the function a failing test goes through ranks higher
than on the statement's words alone, and a named test that is not in the checkout adds nothing. Functions a
traceback in the statement passes through (pytest's frames or Python's) come first, innermost first; then the
constructor of a class whose object lacks an attribute; then the functions the statement calls by name or reads as
attributes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from envs.swe.gitrepo import BareRepo
from envs.swe.retrieval import called_names, named_tests, retrieve_functions, traceback_lines

LIB = '''def normalize_weights(values):
    total = sum(values)
    return [v / total for v in values]


def parse_duration(text):
    hours, _, minutes = text.partition(":")
    return int(hours) * 60 + int(minutes)


def duration_label(minutes):
    return f"{minutes // 60}h{minutes % 60:02d}"
'''
TESTS = '''from pkg.core import normalize_weights


class TestBalance:
    def test_shares_are_fractions(self):
        assert sum(normalize_weights([1, 3])) == 1.0
'''
STATEMENT = """There is a regression in pkg: tests that should pass are failing.

This test fails:
- `tests/test_core.py::TestBalance::test_shares_are_fractions`
- `tests/test_gone.py::test_not_in_the_checkout`

Output of the failing test (trimmed):

```
TestBalance.test_shares_are_fractions
E   assert 0.5 == 1.0
```
Durations print fine and parse fine, a duration label too.
"""


def repo(tmp_path: Path, lib: str = LIB) -> tuple[BareRepo, str]:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "pkg" / "core.py").write_text(lib)
    (src / "tests" / "test_core.py").write_text(TESTS)
    bare = BareRepo.create(tmp_path / "pkg.git")
    return bare, bare.commit_directory(src, "pkg 1.0")


def test_the_named_tests_source_is_read_from_the_checkout_and_missing_ones_add_nothing(tmp_path: Path) -> None:
    bare, commit = repo(tmp_path)
    bodies = named_tests(bare, commit, STATEMENT)
    assert bodies == ["    def test_shares_are_fractions(self):\n        assert sum(normalize_weights([1, 3])) == 1.0"]
    assert named_tests(bare, commit, "No test is named here.") == []


def test_the_function_a_failing_test_calls_ranks_first(tmp_path: Path) -> None:
    bare, commit = repo(tmp_path)
    ranked = [label for label, _ in retrieve_functions(bare, commit, STATEMENT)]
    assert ranked[0] == "pkg/core.py:1 normalize_weights"
    # On the statement's words alone (the test's source not in the checkout), the durations come first.
    alone = [label for label, _ in retrieve_functions(bare, commit, STATEMENT.replace("test_core.py", "test_x.py"))]
    assert alone[0] != "pkg/core.py:1 normalize_weights"
    # Test files are never context, named or not.
    assert not any(label.startswith("tests/") for label in ranked)


def test_functions_a_pasted_traceback_passes_through_come_first(tmp_path: Path) -> None:
    bare, commit = repo(tmp_path)
    # The words all point at the durations; the traceback's frames at the weights (line 3: inside the function).
    pytest_frames = STATEMENT + "tests/test_core.py:6: in test_shares_are_fractions\npkg/core.py:3: in normalize\n"
    ranked = [label for label, _ in retrieve_functions(bare, commit, pytest_frames.replace("test_core", "test_x"))]
    assert ranked[0] == "pkg/core.py:1 normalize_weights" and len(ranked) == 3
    python_frames = STATEMENT.replace("test_core", "test_x") + (
        'Traceback (most recent call last):\n  File "/usr/lib/python3/site-packages/pkg/core.py", line 8, in '
        'parse_duration\n    return int(hours) * 60 + int(minutes)\nValueError: invalid literal\n')
    ranked = [label for label, _ in retrieve_functions(bare, commit, python_frames)]
    assert ranked[0] == "pkg/core.py:6 parse_duration"
    # A frame outside every function (a module's top level, another file) moves nothing.
    elsewhere = STATEMENT.replace("test_core", "test_x") + "pkg/core.py:4: in <module>\npkg/other.py:3: in f\n"
    assert [label for label, _ in retrieve_functions(bare, commit, elsewhere)] == alone_ranking(bare, commit)


def alone_ranking(bare: BareRepo, commit: str) -> list[str]:
    return [label for label, _ in retrieve_functions(bare, commit, STATEMENT.replace("test_core", "test_x"))]


def test_traceback_lines_reads_both_formats_in_order_once_each() -> None:
    text = ('a/b.py:3: in f\n    x()\n  File "/abs/a/c.py", line 9, in g\na/b.py:3: in f\n'
            "E   a/b.py:4: not a frame, an error line\n")
    assert traceback_lines(text) == [("a/b.py", 3), ("/abs/a/c.py", 9)]


# As the task builder writes a failing-test statement (launch/data/statement.py), library frames kept.
BUILDER_STATEMENT = """I ran the test suite of pkg 1.0 and got failures.

These 2 tests fail:
- `tests/test_x.py::test_label`
- `tests/test_x.py::test_weights`

Output of the failing tests (trimmed):

```
test_label
tests/test_x.py:7: in test_label
    assert duration_label(90) == "1h30"
E   AssertionError: assert '1h3' == '1h30'
```
```
test_weights
tests/test_x.py:11: in test_weights
    shares = normalize_weights([0, 0])
pkg/core.py:3: in normalize_weights
    return [v / parse_duration(total) for v in values]
pkg/core.py:8: in parse_duration
    return int(hours) * 60 + int(minutes)
E   ValueError: invalid literal for int() with base 10: ''
```

The tests are correct; the bug is in the library. A fix should make these tests pass and keep the rest green.
"""


def test_the_innermost_frame_comes_first_then_the_functions_the_failing_lines_call(tmp_path: Path) -> None:
    bare, commit = repo(tmp_path)
    ranked = [label for label, _ in retrieve_functions(bare, commit, BUILDER_STATEMENT)]
    # Where the error surfaced, then the frame that called it, then `duration_label(90)` of the other failing line.
    assert ranked == ["pkg/core.py:6 parse_duration", "pkg/core.py:1 normalize_weights",
                      "pkg/core.py:11 duration_label"]


def test_a_called_name_many_functions_share_points_at_none_of_them(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    shared = "".join(f"class C{i}:\n    def get(self, key):\n        return key\n\n\n" for i in range(4))
    (src / "pkg" / "core.py").write_text(LIB + "\n\n" + shared + "def get_label(key):\n    return key\n")
    bare = BareRepo.create(tmp_path / "pkg.git")
    commit = bare.commit_directory(src, "pkg 1.0")
    statement = ("Durations parse wrong: parse_duration reads hours and minutes of a duration text, but "
                 "`cache.get(text)` then holds the wrong duration minutes.")
    ranked = [label for label, _ in retrieve_functions(bare, commit, statement)]
    # Four `get` methods: the call is no pointer, and the words rank the duration parser first.
    assert ranked[0] == "pkg/core.py:6 parse_duration"
    assert called_names(statement) == {"get"}


def test_an_attribute_the_failing_line_reads_points_at_the_property_of_that_name(tmp_path: Path) -> None:
    walk = ("\n\nclass WalkError(Exception):\n    @property\n    def first_path(self):\n        return self.args[0]\n")
    bare, commit = repo(tmp_path, LIB + walk)
    # pathspec's shape: the failing line reads a property (no call, no library frame), and the words are those of
    # the duration parser, which BM25 alone ranks first.
    statement = ("Parsing the hours and minutes of a duration text fails when the tree walk ends:\n```\n"
                 "tests/test_walk.py:12: in test_parse_duration_text_hours_minutes\n"
                 "    assert context.exception.first_path == 'Dir'\nE   AssertionError: '/tmp/x/Dir' != 'Dir'\n```\n")
    assert {"exception", "first_path"} <= called_names(statement)
    ranked = [label for label, _ in retrieve_functions(bare, commit, statement)]
    assert ranked[0] == "pkg/core.py:16 WalkError.first_path"


def test_an_object_missing_an_attribute_points_at_its_class_constructor(tmp_path: Path) -> None:
    box = ("\n\nclass Box:\n    def __init__(self, value):\n        self.label = str(value)\n\n"
           "    def show(self):\n        return self.value\n")
    bare, commit = repo(tmp_path, LIB + box)
    # voluptuous' shape (a removed `self.x = ...`): the frame is the method that read it, the words the parser's.
    statement = ("Parsing the hours and minutes of a duration text fails:\n```\n"
                 "tests/test_box.py:12: in test_parse_duration_text_hours_minutes\n    Box(90).show()\n"
                 "pkg/core.py:20: in show\n    return self.value\n"
                 "E   AttributeError: 'Box' object has no attribute 'value'\n```\n")
    ranked = [label for label, _ in retrieve_functions(bare, commit, statement)]
    assert ranked[:2] == ["pkg/core.py:19 Box.show", "pkg/core.py:16 Box.__init__"]


TIE = """
from envs.swe.retrieval import _doc, rank
body = "def {0}(self):\\n    return [line for line in self.lines if line.is_{0} and line.target_line_no]\\n"
docs = tuple(_doc(f"pkg/patch.py:{10 * i} Hunk.{w}", body.format(w)) for i, w in enumerate(["removed", "added"]))
query = "The hunk counts added and removed lines wrong: target_line_no is_added is_removed lines self"
print(*[d.path for d in rank(docs, query, 2)])
"""


def test_equal_scores_tie_by_path_whatever_the_processs_hash_seed() -> None:
    # unidiff's `Hunk.added` and `Hunk.removed` score alike; summed in a set's order the float sums differed in
    # their last bits, and so the order (and the prompt) changed from one process to the next.
    root = Path(__file__).resolve().parents[3]
    orders = {subprocess.run([sys.executable, "-c", TIE], cwd=root, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in range(6)}
    assert orders == {"pkg/patch.py:0 Hunk.removed pkg/patch.py:10 Hunk.added"}


GUARDED = '''import json
import sys

try:
    import yaml
except ImportError:
    def to_yaml(obj):
        raise RuntimeError("no yaml")
else:
    def to_yaml(obj):
        return yaml.safe_dump(obj)

if sys.version_info >= (3, 8):
    class Box:
        with open(__file__):
            def unbox(self):
                return self.value


def render(obj):
''' + "".join(f"    part{i} = obj.get({i})\n" for i in range(160)) + '''    def escape(text):
        return text.replace("<", "&lt;")
    return escape(json.dumps(obj))


def short(obj):
    def inner():
        return obj
    return inner
'''


def test_functions_under_a_statement_or_in_a_function_too_long_to_show_are_listed_as_the_builder_names_them() -> None:
    from envs.swe.retrieval import function_spans
    from launch.data.mutations import ModuleSites

    names = [name for name, _, _ in function_spans(GUARDED)]
    assert names == ["to_yaml", "to_yaml", "Box.unbox", "render", "render.escape", "short"]
    builder = {f.qualname.split("#")[0] for f in ModuleSites(GUARDED, "pkg/fmt.py").functions}
    assert builder - set(names) == {"short.inner"}  # shown inside `short`, which is shown whole


def test_a_traceback_frame_in_a_function_defined_under_try_else_ranks_it_first(tmp_path: Path) -> None:
    bare, commit = repo(tmp_path, GUARDED)
    statement = ("Dumping fails.\n\n```\ntests/test_fmt.py:3: in test_dump\n    to_yaml({})\n"
                 "pkg/core.py:11: in to_yaml\n    return yaml.safe_dump(obj)\nE   TypeError: boom\n```\n")
    ranked = [label for label, _ in retrieve_functions(bare, commit, statement)]
    assert ranked[0] == "pkg/core.py:10 to_yaml"
