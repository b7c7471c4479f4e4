"""Every task has a commit of its own (the builder commits each bug; SWE-bench pins each instance), but a commit's
files are mostly its repository's other commits' files. Retrieval keeps a file's documents and functions by
content: the index of a commit that changes one file parses that file alone, and ranks its new text, never the
text of the commit before."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from envs.swe import retrieval
from envs.swe.gitrepo import BareRepo

CORE = '''def parse_duration(text):
    hours, _, minutes = text.partition(":")
    return int(hours) * 60 + int(minutes)
'''
UNITS = "\n\n".join(f"def unit_{i}(value):\n    return value * {i}\n" for i in range(20))
TESTS = '''from pkg.core import parse_duration


def test_parse_duration():
    assert parse_duration("1:30") == 90
'''
STATEMENT = """`tests/test_core.py::test_parse_duration` fails: parse_duration("1:30") gives 91.

```
tests/test_core.py:5: in test_parse_duration
    assert parse_duration("1:30") == 90
E   assert 91 == 90
```
"""


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources retrieval parses, from caches emptied for the test."""
    retrieval.clear_caches()
    seen: list[str] = []
    real = ast.parse

    def parse(source: str, *args: Any, **kwargs: Any) -> ast.Module:
        seen.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(retrieval.ast, "parse", parse)
    return seen


def test_a_commit_changing_one_file_parses_that_file_alone_and_ranks_its_new_text(
        tmp_path: Path, parses: list[str]) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "tests").mkdir()
    (src / "pkg" / "core.py").write_text(CORE)
    (src / "pkg" / "units.py").write_text(UNITS)
    (src / "tests" / "test_core.py").write_text(TESTS)
    repo = BareRepo.create(tmp_path / "pkg.git")
    clean = repo.commit_directory(src, "pkg 1.0")
    buggy = CORE.replace("int(minutes)", "int(minutes) + 1")
    bug = repo.commit_replacing(clean, {"pkg/core.py": buggy}, "bug")

    first = retrieval.retrieve_functions(repo, clean, STATEMENT)
    assert first[0] == ("pkg/core.py:1 parse_duration", CORE.rstrip("\n"))
    assert sorted(parses) == sorted([CORE, UNITS, TESTS])  # the named test is parsed for the query

    parses.clear()
    second = retrieval.retrieve_functions(repo, bug, STATEMENT)
    assert parses == [buggy]  # units.py and the unchanged test file come from the cache
    assert second[0] == ("pkg/core.py:1 parse_duration", buggy.rstrip("\n"))
    assert [label for label, _ in second] == [label for label, _ in first]


def test_function_spans_hands_each_caller_a_list_of_its_own(parses: list[str]) -> None:
    spans = retrieval.function_spans(CORE)
    spans.append(("intruder", 1, 1))
    assert retrieval.function_spans(CORE) == [("parse_duration", 1, 3)]
    assert parses == [CORE]
