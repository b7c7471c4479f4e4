"""Code context retrieved from the problem statement: BM25 over the repository's source files at `base_commit`.

This is SWE-bench's retrieval setting (its `bm25` prompts) and the only code context a prompt gets: the query is
the problem statement and the corpus is the checkout, so nothing the policy sees is derived from the gold patch
(the "oracle" setting, the files the gold patch touches, told the policy where the fix is). Test files are left out
of the corpus: the policy is told to change library code, and the hidden tests are gold-side.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path, PurePosixPath

from envs.swe.gitrepo import BareRepo

TOP_K = 5
"""Files ranked for the prompt (in rank order, each in whole or not at all); more rarely fit a prompt budget."""
TOP_K_FUNCTIONS = 12
"""Functions ranked for a `bm25_functions` prompt (each in whole or not at all)."""
_MAX_FUNCTION_LINES = 150  # a longer function is a file's worth of prompt; it is still named, never cut
_MAX_FILE_BYTES = 400_000  # larger sources (generated tables, vendored bundles) never fit a prompt anyway
_SOURCE_SUFFIXES = {".py", ".pyx", ".pyi"}
_TEST_DIRS = {"test", "tests", "testing"}
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_K1, _B = 1.2, 0.75  # the usual BM25 constants (Robertson & Zaragoza), as Pyserini's defaults in SWE-bench


def tokens(text: str) -> list[str]:
    """Identifiers, lowercased, plus their `_`-separated parts: `separability_matrix` also matches `matrix`."""
    out: list[str] = []
    for word in _WORD.findall(text):
        low = word.lower()
        out.append(low)
        parts = [p for p in low.split("_") if p]
        if len(parts) > 1:
            out += parts
    return out


def is_test_path(path: str) -> bool:
    p = PurePosixPath(path)
    return (any(part in _TEST_DIRS for part in p.parts[:-1]) or p.name.startswith("test_")
            or p.name.endswith("_test.py") or p.name == "conftest.py")


@dataclass(frozen=True)
class _Doc:
    path: str
    text: str
    counts: Counter[str]
    length: int


@lru_cache(maxsize=8)  # one index per (repository, commit); tasks of a commit share it
def _index(repo_path: str, commit: str) -> tuple[_Doc, ...]:
    repo = BareRepo(repo_path)
    sizes = repo.file_sizes(commit)
    paths = [p for p, n in sizes.items() if PurePosixPath(p).suffix in _SOURCE_SUFFIXES and n <= _MAX_FILE_BYTES
             and not is_test_path(p) and "\n" not in p]
    return tuple(_file_doc(path, text) for path, text in repo.read_files(commit, paths).items())


# Every task of a synthetic set, and of SWE-bench, has a commit of its own, but its files are mostly those of the
# other tasks of its repository: a file's document and its functions are kept by content, so that a commit's index
# parses and counts only the files it changed (the speedrun's 287 held-out prompts: 25.0 -> 14.4 s here,
# benchmarks/prompt_build_bench.py). Bounded by files, not commits: a large repository's checkout holds a few
# thousand.
_FILE_CACHE = 8192


def _doc(path: str, text: str) -> _Doc:
    words = tokens(path) + tokens(text)
    return _Doc(path, text, Counter(words), len(words))


_file_doc = lru_cache(maxsize=_FILE_CACHE)(_doc)


def rank(docs: tuple[_Doc, ...], query: str, k: int = TOP_K) -> list[_Doc]:
    """The k documents with the best BM25 score for `query` (score > 0), best first; ties by path."""
    if not docs:
        return []
    # A score is a float sum over the terms: summed in a set's order (which a process's hash seed sets), two
    # documents of equal score (`Hunk.added`, `Hunk.removed`) came out in one order in one process and the other in
    # the next, and so did the prompts. Summed in sorted order and rounded, equal scores tie, and ties go by path.
    terms = sorted(set(tokens(query)))
    avg = sum(d.length for d in docs) / len(docs) or 1.0
    df = Counter(t for d in docs for t in terms if t in d.counts)
    idf = {t: math.log(1 + (len(docs) - n + 0.5) / (n + 0.5)) for t, n in df.items()}
    scored = []
    for d in docs:
        score = 0.0
        for t, w in idf.items():
            f = d.counts.get(t, 0)
            if f:
                score += w * f * (_K1 + 1) / (f + _K1 * (1 - _B + _B * d.length / avg))
        if score > 0:
            scored.append((-round(score, 9), d.path, d))
    return [d for _, _, d in sorted(scored, key=lambda s: (s[0], s[1]))[:k]]


def retrieve(repo: BareRepo, commit: str, statement: str, k: int = TOP_K) -> list[tuple[str, str]]:
    """(path, text) of the k source files at `commit` that best match `statement`, best first."""
    return [(d.path, d.text) for d in rank(_index(str(Path(repo.path).resolve()), commit), statement, k)]


# Statements whose bodies may define functions of the module or class they are in: `try: import json ... else:
# def to_json(...)`, `if sys.version_info >= ...:`, `with warnings.catch_warnings():`.
_BLOCKS = (ast.If, ast.Try, ast.TryStar, ast.ExceptHandler, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While,
           ast.Match, ast.match_case)


def function_spans(text: str) -> list[tuple[str, int, int]]:
    """(qualified name, first line with decorators, last line) of every function and method of a module, those
    defined under an `if`, `try` or `with` included (named as if they were not); a nested function stays inside its
    parent, unless the parent is too long to be shown (`_MAX_FUNCTION_LINES`): then it is listed too, under the
    parent's name (`Schema.json_schema._to_type`), as the task builder names the functions it mutates. A module
    that does not parse (Python 2 leftovers) has none."""
    return list(_module_spans(text))


@lru_cache(maxsize=_FILE_CACHE)
def _module_spans(text: str) -> tuple[tuple[str, int, int], ...]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return ()
    out: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                end = child.end_lineno or child.lineno
                out.append((f"{prefix}{child.name}", start, end))
                if end - start >= _MAX_FUNCTION_LINES:
                    visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, _BLOCKS):
                visit(child, prefix)

    visit(tree, "")
    return tuple(out)


def _functions(path: str, text: str) -> list[tuple[str, str]]:
    """(label, source) of the module's functions shorter than `_MAX_FUNCTION_LINES`. The label names the file, the
    first line and the qualified name, as the prompt shows it: `pkg/mod.py:120 Class.method`."""
    lines = text.splitlines()
    return [(f"{path}:{start} {qualname}", "\n".join(lines[start - 1:end]))
            for qualname, start, end in function_spans(text) if end - start < _MAX_FUNCTION_LINES]


def function_docs(files: Iterable[tuple[str, str]]) -> tuple[_Doc, ...]:
    """The `bm25_functions` corpus of (path, text) source files: one document per function, labelled as shown."""
    return tuple(d for path, text in files if path.endswith(".py") for d in _file_function_docs(path, text))


@lru_cache(maxsize=_FILE_CACHE)
def _file_function_docs(path: str, text: str) -> tuple[_Doc, ...]:
    return tuple(_doc(label, body) for label, body in _functions(path, text))


@lru_cache(maxsize=8)
def _function_index(repo_path: str, commit: str) -> tuple[_Doc, ...]:
    return function_docs((f.path, f.text) for f in _index(repo_path, commit))


CONTENT_CACHES = (_file_doc, _module_spans, _file_function_docs)
"""The caches kept by file content; `_index` and `_function_index` are kept by commit."""


def clear_caches(*, by_commit: bool = True) -> None:
    """Empty the content caches, and the per-commit indexes too unless `by_commit` is False (tests, benchmarks)."""
    for cached in (*CONTENT_CACHES, *((_index, _function_index) if by_commit else ())):
        cached.cache_clear()


_TEST_ID = re.compile(r"([\w./-]+\.py)::([\w:]+)")
_MAX_NAMED_TESTS = 5


def named_tests(repo: BareRepo, commit: str, statement: str) -> list[str]:
    """Source of the tests the statement names (`path::Class::test` ids, as a failing-test report lists them) that
    exist at `commit`, the first few: what a developer reads first to see which code a failure goes through. Only
    the statement and the checkout are read; a test that is not in the checkout (SWE-bench adds its FAIL_TO_PASS
    tests with the hidden test patch) simply adds nothing."""
    ids = [(path, name) for path, name in dict.fromkeys(_TEST_ID.findall(statement)) if is_test_path(path)]
    ids = ids[:_MAX_NAMED_TESTS]
    if not ids:
        return []
    texts = repo.read_files(commit, sorted({path for path, _ in ids}))
    out = []
    for path, name in ids:
        text = texts.get(path, "")
        wanted = name.replace("::", ".")
        span = next(((start, end) for qualname, start, end in function_spans(text) if qualname == wanted), None)
        if span is not None:
            out.append("\n".join(text.splitlines()[span[0] - 1:span[1]]))
    return out


# A traceback frame: pytest's `--tb=short` (`pkg/mod.py:12: in name`) or Python's (`File "/x/pkg/mod.py", line
# 12, in name`).
_PYTEST_FRAME = re.compile(r"^\s*(\S+?\.py):(\d+): in \S+$", re.MULTILINE)
_PYTHON_FRAME = re.compile(r'^\s*File "([^"]+?\.py)", line (\d+), in \S+$', re.MULTILINE)


def traceback_lines(statement: str) -> list[tuple[str, int]]:
    """(path, line) of every traceback frame the statement shows, in order, once each."""
    found = [(m.start(), m.group(1), int(m.group(2)))
             for pattern in (_PYTEST_FRAME, _PYTHON_FRAME) for m in pattern.finditer(statement)]
    return list(dict.fromkeys((path, line) for _, path, line in sorted(found)))


def _in_frame(doc: _Doc, frames: list[tuple[str, int]]) -> bool:
    path, _, rest = doc.path.rpartition(":")
    start = int(rest.split(" ", 1)[0])
    end = start + doc.text.count("\n")
    # A frame's path is relative to the checkout (pytest) or absolute where the package was installed (Python).
    return any((p == path or p.endswith("/" + path)) and start <= line <= end for p, line in frames)


# A call written out in the statement (`name(`): a failing assertion's `duration_isoformat(Duration(0))`; an
# attribute read (`.name`, not called): `context.exception.first_path`, a property's getter.
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_ATTR = re.compile(r"(?<=\w)\.([A-Za-z_]\w*)\b(?!\s*\()")
_MAX_SAME_NAME = 3
_NO_ATTRIBUTE = re.compile(r"'([A-Za-z_]\w*)' object has no attribute '[A-Za-z_]\w*'")


def called_names(statement: str) -> set[str]:
    """Names the statement calls or reads as attributes: in a failing test's source line, an error message or a
    snippet. Attribute reads (a property is a function) took the held-out prompts showing their fix from 201 to 209
    at 1,792 tokens and 249 to 253 at 4,096 (`benchmarks/prompt_fix_shown.py`; 519 -> 520 and 603 -> 604 of the
    training tasks)."""
    return set(_CALL.findall(statement)) | set(_ATTR.findall(statement))


def _qualname(doc: _Doc) -> str:
    return doc.path.rsplit(" ", 1)[-1]  # `path:line Class.method` -> `Class.method`


def _function_name(doc: _Doc) -> str:
    return _qualname(doc).rsplit(".", 1)[-1]  # `Class.method` -> `method`


def retrieve_functions(repo: BareRepo, commit: str, statement: str, k: int = TOP_K_FUNCTIONS
                       ) -> list[tuple[str, str]]:
    """(label, source) of the k functions at `commit` that best match `statement`, best first: the `bm25_functions`
    context, for budgets too small for whole files (a small model's). Same corpus and BM25 as `retrieve`, at the
    granularity of functions; the query is the statement and the source of the tests it names (`named_tests`).
    A developer reading a bug report opens, in this order: the functions its traceback passes through, innermost
    (the last frame printed, where the error surfaced) first; the constructor of a class whose object "has no
    attribute" the error names (`'Or' object has no attribute 'match_count'`: an attribute `__init__` should have
    set); the functions it calls by name (a failing line's `parse_duration(...)`) or reads as attributes
    (`exc.first_path`), in BM25 order; then the rest by BM25. Still nothing from the gold patch.

    Held-out prompts of the speedrun showing their fix (`benchmarks/prompt_fix_shown.py`), the constructors added:
    209 -> 217 at 1,792 tokens, 253 -> 258 at 4,096 (training tasks 520 -> 526, 604 -> 606)."""
    query = "\n".join([statement, *named_tests(repo, commit, statement)])
    docs = _function_index(str(Path(repo.path).resolve()), commit)
    ranked: dict[str, _Doc] = {}
    for frame in reversed(traceback_lines(statement)):
        for d in docs:
            if _in_frame(d, [frame]):
                ranked.setdefault(d.path, d)
    # `'Or' object has no attribute 'match_count'`: an attribute the class's constructor should have set.
    owners = {f"{cls}.__init__" for cls in _NO_ATTRIBUTE.findall(statement)}
    if owners:
        for d in docs:
            if _qualname(d) in owners or any(_qualname(d).endswith("." + o) for o in owners):
                ranked.setdefault(d.path, d)
    names = called_names(statement)
    called = [d for d in docs if _function_name(d) in names]
    defined = Counter(_function_name(d) for d in called)
    # A name many functions share (`get`, `save` in a large repository) points at none of them.
    called = [d for d in called if defined[_function_name(d)] <= _MAX_SAME_NAME]
    # A called function sharing no word with the query still comes before the rest.
    for d in [*rank(tuple(called), query, len(called)), *called, *rank(docs, query, k + len(ranked) + len(called))]:
        ranked.setdefault(d.path, d)
    return [(d.path, d.text) for d in list(ranked.values())[:k]]
