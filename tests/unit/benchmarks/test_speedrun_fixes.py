"""SFT fixes from corpus code (benchmarks/speedrun/fixes.py) on real modules (the standard library's): a mutation
spliced into one function and nowhere else, and a fixing diff that `git apply` takes back to the original."""

from __future__ import annotations

import random
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import fixes  # noqa: E402
from prompting import Prompting  # noqa: E402

from envs.swe.patch import extract_patch  # noqa: E402
from envs.swe.retrieval import function_spans  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
MODULES = ["textwrap.py", "shlex.py", "fnmatch.py", "colorsys.py", "bisect.py", "calendar.py"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def commit_bug(repo: Path, path: str, buggy: str) -> Path:
    """`buggy` committed at `path` in `repo` (made on first use); the file's path."""
    if not (repo / ".git").is_dir():
        repo.mkdir(parents=True, exist_ok=True)
        git(repo, "init", "-q")
    file = repo / path
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(buggy)
    git(repo, "add", path)
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", f"bug in {path}")
    return file


def apply_fix(repo: Path, completion: str) -> None:
    """The completion read back as the sandbox reads an answer, then `git apply`."""
    extracted = extract_patch(completion)
    assert extracted.ok, extracted.detail
    (repo / "fix.diff").write_text(extracted.patch)
    git(repo, "apply", "fix.diff")


def printed_by_git(repo: Path, *args: str) -> str:
    return "".join(line + "\n" for line in git(repo, "diff", *args).splitlines() if not line.startswith("index "))


COLORSYS = (STDLIB / "colorsys.py").read_text()
COLORSYS_BUG = COLORSYS.replace("    if l <= 0.5:", "    if l > 0.5:", 1)


def mutations(n_per_module: int = 6) -> list[tuple[str, str, str, int, int]]:
    """(path, original, buggy, start, end) of seeded single-site mutations of real modules."""
    out = []
    for name in MODULES:
        text = (STDLIB / name).read_text()
        rng = random.Random(name)
        functions = function_spans(text)
        for _qualname, start, end in rng.sample(functions, min(len(functions), 4 * n_per_module)):
            mutated = fixes._mutate_function(text, f"lib/{name}", start, end, rng)
            if mutated is not None:
                out.append((f"lib/{name}", text, mutated[0], start, end))
            if sum(1 for m in out if m[0] == f"lib/{name}") == n_per_module:
                break
    return out


@pytest.fixture(scope="module")
def cases() -> list[tuple[str, str, str, int, int]]:
    found = mutations()
    assert len(found) >= 4 * len(MODULES), "too few mutable functions in the standard library modules"
    return found


def test_a_mutation_changes_only_its_own_function(cases: list[tuple[str, str, str, int, int]]) -> None:
    for path, original, buggy, start, end in cases:
        a, b = original.split("\n"), buggy.split("\n")
        assert buggy != original, path
        shift = len(b) - len(a)  # a removed statement shortens the function, nothing else
        assert a[: start - 1] == b[: start - 1], (path, start)
        assert a[end:] == b[end + shift:], (path, end)
        compile(buggy, path, "exec")


def test_the_fixing_diff_applies_with_git_and_restores_the_file(
        cases: list[tuple[str, str, str, int, int]], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for path, original, buggy, _, _ in cases:
        file = commit_bug(repo, path, buggy)
        # The completion as SFT shows it, read back as the sandbox reads an answer.
        apply_fix(repo, fixes.completion(fixes.git_diff(path, buggy, original)))
        assert file.read_text() == original, path


def test_the_diff_is_the_one_git_prints_without_the_index_line(tmp_path: Path) -> None:
    assert COLORSYS_BUG != COLORSYS
    repo = tmp_path / "repo"
    commit_bug(repo, "lib/colorsys.py", COLORSYS_BUG).write_text(COLORSYS)
    assert fixes.git_diff("lib/colorsys.py", COLORSYS_BUG, COLORSYS) == printed_by_git(repo)
    assert "index " not in fixes.completion(git(repo, "diff"))


def test_a_diff_trimmed_to_one_context_line_is_gits_own_and_still_applies(
        cases: list[tuple[str, str, str, int, int]], tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    commit_bug(repo, "lib/colorsys.py", COLORSYS_BUG).write_text(COLORSYS)
    u1 = printed_by_git(repo, "-U1")
    assert fixes.trim_context(fixes.git_diff("lib/colorsys.py", COLORSYS_BUG, COLORSYS), 1) == u1
    assert fixes.git_diff("lib/colorsys.py", COLORSYS_BUG, COLORSYS, context=1) == u1
    # Every seeded mutation's fix, trimmed to one line of context, takes the buggy file back to the original.
    for path, orig, bug, _, _ in cases:
        file = commit_bug(repo, path, bug)
        apply_fix(repo, fixes.completion(fixes.git_diff(path, bug, orig), context_lines=1))
        assert file.read_text() == orig, path
    with pytest.raises(ValueError, match="context lines must be >= 1"):
        fixes.trim_context(u1, 0)


def test_a_corpus_fix_names_the_function_but_leaves_the_path_to_the_code_context(tmp_path: Path) -> None:
    """A task's statement names failing tests, never a file: a corpus fix's statement that named the path taught the
    model to copy a path from the statement, and it invented one on tasks (100 of 286 held-out answers)."""
    import json
    import lzma

    import corpus

    (tmp_path / "corpus").mkdir()
    with lzma.open(tmp_path / "corpus" / "train.jsonl.xz", "wt") as f:
        for name in MODULES[:3]:
            f.write(json.dumps({"package": "stdlib", "path": name, "text": (STDLIB / name).read_text()}) + "\n")
    tok = corpus.train_tokenizer(tmp_path / "corpus", tmp_path / "tok", vocab_size=512)
    fixes._init_worker(str(tok))
    made = 0
    for i, name in enumerate(MODULES[:3]):
        path = f"lib/{name}"
        text = (STDLIB / name).read_text()
        example, outcome = fixes._one_file(("stdlib", path, text, [], Prompting(), f"t-{i}", 1, 0.0))
        if example is None:
            continue
        made += 1
        prompt, answer = example["prompt"], example["completion"]
        # Every mention of the path in the prompt is a code-context header; the answer's diff names it.
        headers = prompt.count(f"[start of {path}:") + prompt.count(f"[end of {path}:")
        assert prompt.count(path) == headers >= 2, prompt[:600]
        assert f"+++ b/{path}" in answer
    assert made >= 2


def test_package_roots_are_read_off_library_paths() -> None:
    assert fixes.import_root("src/accelerate/commands/merge.py") == "accelerate"
    assert fixes.import_root("addict/addict.py") == "addict"
    assert fixes.import_root("six.py") == "six"
    assert fixes.import_root("lib/yaml/__init__.py") == "yaml"
    assert fixes.import_root("python-dateutil/x.py") is None  # not an identifier: nothing to rename


@pytest.mark.parametrize(("name", "path"), [("shlex.py", "shlex.py"), ("textwrap.py", "src/textwrap/wrap.py")])
def test_a_renamed_package_is_renamed_everywhere_and_its_fix_still_applies(tmp_path: Path, name: str,
                                                                           path: str) -> None:
    """shlex.py defines `class shlex`: the code shown and the diff mention the package's name, renamed alike."""
    import json
    import lzma
    import re

    import corpus

    (tmp_path / "corpus").mkdir()
    with lzma.open(tmp_path / "corpus" / "train.jsonl.xz", "wt") as f:
        f.write(json.dumps({"package": "stdlib", "path": name, "text": (STDLIB / name).read_text()}) + "\n")
    fixes._init_worker(str(corpus.train_tokenizer(tmp_path / "corpus", tmp_path / "tok", vocab_size=512)))
    original = (STDLIB / name).read_text()
    old = fixes.import_root(path)
    renamed = []
    for i in range(12):
        example, _ = fixes._one_file(("stdlib", path, original, [], Prompting(), f"r-{i}", 1, 1.0))
        if example is not None:
            renamed.append(example)
            # Renamed before the prompt is rendered: within the same token budget as every other prompt.
            assert len(fixes._worker_tok(example["prompt"])["input_ids"]) <= 1792
    assert len(renamed) >= 3
    for k, example in enumerate(renamed):
        assert example is not None
        was, new = example["renamed"].split("->")
        assert was == old and new != old and new.isidentifier()
        mention = re.compile(rf"(?<![A-Za-z0-9_]){old}(?![A-Za-z0-9_])")
        assert not mention.search(example["prompt"]) and not mention.search(example["completion"])
        new_path = mention.sub(new, path)
        assert f"[start of {new_path}:" in example["prompt"] and f"+++ b/{new_path}" in example["completion"]
        # The renamed fix takes the renamed project's buggy file back to the renamed original: undone, then redone.
        repo = tmp_path / f"repo-{k}"
        file = commit_bug(repo, new_path, mention.sub(new, original))
        extracted = extract_patch(example["completion"])
        assert extracted.ok, extracted.detail
        (repo / "fix.diff").write_text(extracted.patch)
        git(repo, "apply", "-R", "fix.diff")
        assert file.read_text() != mention.sub(new, original)
        git(repo, "apply", "fix.diff")
        assert file.read_text() == mention.sub(new, original)
    if name == "shlex.py":  # the methods of `class shlex` shown under the new name: `[start of NEW.py:N NEW.method]`
        assert any(re.search(rf"\[start of {new}\.py:\d+ {new}\.\w", ex["prompt"])
                   for ex in renamed if ex for new in [ex["renamed"].split("->")[1]])
