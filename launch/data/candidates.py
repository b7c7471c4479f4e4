"""Candidate bugs of one repository, in a deterministic order that spreads them over functions and kinds.

A candidate is `(file, qualname, kind, index)` plus the test files that exercise the function. Only functions that
some test file names (or, for private helpers and dunders, whose module or class a test file names) are used:
a bug in code no test reaches cannot be validated, and trying it would only burn sandbox time.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from launch.data.mutations import BUG_KINDS, FunctionSites, ModuleSites
from launch.data.recipe import RepoRecipe


@dataclass(frozen=True)
class Candidate:
    order: int
    """Position in the validation order (decisions are made in this order, whatever finishes first)."""
    file: str
    qualname: str
    kind: str
    index: int
    test_files: tuple[str, ...]

    @property
    def function_id(self) -> str:
        return f"{self.file}::{self.qualname}"


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def source_files(root: Path, repo: RepoRecipe) -> list[str]:
    files = []
    for src in repo.source:
        base = root / src
        paths = [base] if base.is_file() else sorted(base.rglob("*.py"))
        for p in paths:
            rel = p.relative_to(root).as_posix()
            if not _under(rel, repo.exclude) and not _under(rel, repo.tests):
                files.append(rel)
    return sorted(set(files))


def test_files(root: Path, repo: RepoRecipe) -> list[str]:
    files = []
    for t in repo.tests:
        base = root / t
        if base.is_file():
            files.append(base)
        else:
            files += [p for p in base.rglob("*.py") if p.name.startswith("test_") or p.name.endswith("_test.py")]
    return sorted({p.relative_to(root).as_posix() for p in files})


def _words(text: str) -> Counter[str]:
    return Counter(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text))


def _module_keys(file: str) -> list[str]:
    parts = Path(file).with_suffix("").parts
    keys = [p for p in parts if p not in ("src", "__init__")]
    return keys[-1:] if keys else []


def _tests_for(fn: FunctionSites, test_words: dict[str, Counter[str]], max_files: int) -> tuple[str, ...]:
    module = _module_keys(fn.file)

    def files_naming(names: list[str]) -> tuple[str, ...]:
        # The files naming it most often, as SWE-bench runs only a task's own test files: more files would mostly
        # add PASS_TO_PASS tests of other functions and slow every sandbox run. Files that also name the module
        # come first: a generic name (`get`, `main`) in another module's tests is usually another function.
        hits = [(-any(words[m] for m in module), -sum(words[n] for n in names), f) for f, words in test_words.items()]
        return tuple(sorted(f for *_, f in sorted(h for h in hits if h[1] < 0)[:max_files]))

    dunder = fn.name.startswith("__") and fn.name.endswith("__")
    private = fn.name.startswith("_") and not dunder
    direct = files_naming([fn.class_name] if dunder and fn.class_name else [fn.name])
    if direct or not (dunder or private):
        return direct
    # Private helpers and dunders are reached through their class or module: the tests naming those.
    return files_naming([fn.class_name] if fn.class_name else module)


def _function_candidates(fn: FunctionSites, rng: random.Random, limit: int) -> list[tuple[str, int]]:
    """Up to `limit` (kind, index) pairs, cycling through the function's kinds in a shuffled order."""
    kinds = [k for k in BUG_KINDS if fn.sites.get(k)]
    rng.shuffle(kinds)
    per_kind = {}
    for k in kinds:
        idx = list(range(fn.sites[k]))
        rng.shuffle(idx)
        per_kind[k] = idx
    out: list[tuple[str, int]] = []
    while len(out) < limit and any(per_kind.values()):
        for k in kinds:
            if per_kind[k] and len(out) < limit:
                out.append((k, per_kind[k].pop()))
    return out


def plan_candidates(
    root: Path, repo: RepoRecipe, seed: int, per_function: int, kinds: tuple[str, ...] = BUG_KINDS,
    max_test_files: int = 3,
) -> tuple[list[Candidate], dict[str, ModuleSites]]:
    """All candidates of a repository in validation order, and the parsed modules to apply them with.

    Order: functions shuffled (seeded by seed and repository), then round-robin: every function's first candidate
    before any function's second, so a capped task set covers as many functions as possible.
    """
    rng = random.Random(f"{seed}:{repo.name}")
    tests = test_files(root, repo)
    test_words = {t: _words((root / t).read_text(encoding="utf-8", errors="replace")) for t in tests}
    modules: dict[str, ModuleSites] = {}
    per_fn: list[tuple[FunctionSites, tuple[str, ...], list[tuple[str, int]]]] = []
    for file in source_files(root, repo):
        mod = ModuleSites((root / file).read_text(encoding="utf-8"), file)
        modules[file] = mod
        for fn in mod.functions:
            chosen = _tests_for(fn, test_words, max_test_files)
            if chosen and fn.sites:
                per_fn.append((fn, chosen, []))
    per_fn.sort(key=lambda item: (item[0].file, item[0].qualname))
    rng.shuffle(per_fn)
    for fn, _, cands in per_fn:
        fn_kinds = FunctionSites(fn.file, fn.qualname, fn.name, fn.class_name, fn.start_line, fn.end_line,
                                 {k: v for k, v in fn.sites.items() if k in kinds})
        cands += _function_candidates(fn_kinds, rng, limit=3 * per_function)
    ordered: list[Candidate] = []
    depth = max((len(c) for _, _, c in per_fn), default=0)
    for r in range(depth):
        for fn, chosen, cands in per_fn:
            if r < len(cands):
                kind, index = cands[r]
                ordered.append(Candidate(len(ordered), fn.file, fn.qualname, kind, index, chosen))
    return ordered, modules
