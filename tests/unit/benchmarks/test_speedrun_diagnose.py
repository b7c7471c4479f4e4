"""Why an answer's diff fails (benchmarks/speedrun/diagnose.py), read from a real module committed in a real git
repository, and checked against `git apply --check` itself: a diff said to be anchored applies, and every other kind
does not."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks" / "speedrun"))
import diagnose  # noqa: E402
import fixes  # noqa: E402

from envs.swe.patch import extract_patch  # noqa: E402

STDLIB = Path(sysconfig.get_paths()["stdlib"])
PATH = "lib/colorsys.py"
ORIGINAL = (STDLIB / "colorsys.py").read_text()
BUGGY = ORIGINAL.replace("    if l <= 0.5:", "    if l > 0.5:", 1)


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=repo, check=check, capture_output=True, text=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A repository whose one commit holds the buggy module; (its .git folder, the commit)."""
    root = tmp_path_factory.mktemp("repo")
    git(root, "init", "-q")
    (root / "lib").mkdir()
    (root / PATH).write_text(BUGGY)
    git(root, "add", PATH)
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "bug")
    return root / ".git", git(root, "rev-parse", "HEAD").stdout.strip()


def answer(diff: str) -> str:
    return f"The comparison is inverted.\n\n```diff\n{diff}```\n"


def applies(repo: tuple[Path, str], text: str) -> bool:
    extracted = extract_patch(text)
    assert extracted.ok, extracted.detail
    work = repo[0].parent
    (work / "answer.diff").write_text(extracted.patch)
    return git(work, "apply", "--check", "answer.diff", check=False).returncode == 0


GOLD = fixes.git_diff(PATH, BUGGY, ORIGINAL)
GOLD_U1 = fixes.git_diff(PATH, BUGGY, ORIGINAL, context=1)


def variants() -> dict[str, str]:
    lines = GOLD.split("\n")
    context = [i for i, line in enumerate(lines) if line.startswith(" ") and line.strip()]
    first = context[0]
    return {
        "anchored": GOLD,
        "anchored_u1": GOLD_U1,
        "invented": "\n".join([*lines[:first], " " + "    total = compute_everything(l, s)", *lines[first + 1:]]),
        "whitespace": "\n".join([*lines[:first], " " + lines[first][1:].replace("    ", "  ", 1),
                                 *lines[first + 1:]]),
        "scattered": "\n".join([*lines[:first], *lines[first + 1:first + 2], lines[first],
                                *lines[first + 2:]]),
        "path": GOLD.replace(PATH, "lib/colour_systems.py"),
    }


def test_each_kind_is_named_and_agrees_with_git_apply(repo: tuple[Path, str]) -> None:
    read = diagnose.repo_reader(*repo)
    for name, diff in variants().items():
        d = diagnose.diagnose(answer(diff), GOLD, read, prompt=BUGGY)
        assert d.kind == name.removesuffix("_u1"), (name, d)
        assert applies(repo, answer(diff)) == (d.kind == "anchored"), name


def test_the_gold_fix_is_recognised_in_any_context_width(repo: tuple[Path, str]) -> None:
    read = diagnose.repo_reader(*repo)
    for diff in (GOLD, GOLD_U1):
        d = diagnose.diagnose(answer(diff), GOLD, read)
        assert (d.gold_file, d.gold_removed, d.gold_added, d.no_op) == (True, True, True, False)
    # A diff that rewrites the buggy line as it was touches the bug but changes nothing.
    no_op = GOLD.replace("+    if l <= 0.5:", "+    if l > 0.5:")
    d = diagnose.diagnose(answer(no_op), GOLD, read)
    assert d.kind == "anchored" and d.gold_removed and not d.gold_added and d.no_op


def test_an_invented_line_is_told_apart_from_one_copied_from_the_prompt(repo: tuple[Path, str]) -> None:
    read = diagnose.repo_reader(*repo)
    copied = "def elsewhere(x):"
    lines = GOLD.split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith(" ") and line.strip())
    diff = "\n".join([*lines[:first], " " + copied, *lines[first + 1:]])
    assert diagnose.diagnose(answer(diff), GOLD, read, prompt=f"{BUGGY}\n{copied}\n").in_prompt is True
    assert diagnose.diagnose(answer(diff), GOLD, read, prompt=BUGGY).in_prompt is False


def test_an_answer_without_a_usable_diff_is_a_format_failure(repo: tuple[Path, str]) -> None:
    read = diagnose.repo_reader(*repo)
    assert diagnose.diagnose("I would change the comparison.", GOLD, read).detail == "missing"
    assert diagnose.diagnose("```diff\n" + GOLD[:80], GOLD, read).detail == "truncated"


def test_each_hunk_is_read_against_its_own_file_in_a_diff_of_several() -> None:
    removed_sql_comment = "-- a comment that starts like a file header"
    diff = ("diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1,2 +1,2 @@\n a = 1\n-b = 2\n+b = 3\n"
            "diff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n@@ -1,2 +1,1 @@\n select 1;\n"
            f"-{removed_sql_comment}\n"
            "diff --git a/new.py b/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+c = 4\n")
    files = {"x.py": "a = 1\nb = 2\n", "q.sql": f"select 1;\n{removed_sql_comment}\n"}
    found = diagnose.hunks(diff)
    assert [(h.path, h.removed, h.new_file) for h in found] == [
        ("x.py", ["b = 2"], False), ("q.sql", [removed_sql_comment], False), ("new.py", [], True)]
    assert diagnose.diagnose(answer(diff), diff, files.get).kind == "anchored"
    files["new.py"] = "c = 4\n"  # creating a file that is already there does not apply
    assert diagnose.diagnose(answer(diff), diff, files.get).kind == "path"


def test_an_answer_cut_off_by_the_generation_limit_is_counted_unfinished(repo: tuple[Path, str]) -> None:
    """A round's answers as token ids (the fleet's log): one ends on the chat's end token, one loops until the
    limit cuts it (as the sixth run's held-out answers did after GRPO)."""
    from types import SimpleNamespace

    from fleet.tokenizer import load_tokenizer
    from workshop.resolve import resolve_model

    tok = load_tokenizer(resolve_model("tiny-qwen2"))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    finished = tok.encode(answer(GOLD)) + [end]
    looping = tok.encode(answer("-    if if if if if if if if")) * 8
    task = SimpleNamespace(repo="", base_commit=repo[1], patch=GOLD)  # repos / ".git" is the fixture's repository
    rounds = [{"step": 0, "verdicts": {"a": "resolved", "b": "no_patch"}, "answers": {"a": finished, "b": looping}}]
    (table,) = diagnose.round_table(rounds, {"a": task, "b": task}, tok, repo[0].parent)
    assert table["answers"] == 2 and table["unfinished"] == 1
    assert table["kinds"]["anchored"] == 1
    # Both answers are the task's repository's; only the finished one names the gold patch's file.
    assert table["gold_file_by_repo"] == {"": [1, 2]}


def test_answers_written_in_another_tokenisation_are_not_counted_as_encoded(repo: tuple[Path, str]) -> None:
    """The ninth run's model wrote ` a/` as `Ġa`, `/`: ids the tokenizer never makes of that text, because every
    stage had encoded with another split. The round table counts the answers that are the tokenizer's own encoding."""
    from types import SimpleNamespace

    from fleet.tokenizer import load_tokenizer
    from workshop.resolve import resolve_model

    tok = load_tokenizer(resolve_model("tiny-qwen2"))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    own = tok.encode(answer(GOLD)) + [end]
    # The same text, one character a token: it decodes alike, but is not how the tokenizer spells it.
    spelt = [tok.convert_tokens_to_ids(c) for c in tok.convert_ids_to_tokens(own[:-1]) for c in c] + [end]
    assert tok.decode(spelt) == tok.decode(own) and spelt != own
    task = SimpleNamespace(repo="", base_commit=repo[1], patch=GOLD)
    rounds = [{"step": 0, "verdicts": {"a": "resolved", "b": "resolved"}, "answers": {"a": own, "b": spelt}}]
    (table,) = diagnose.round_table(rounds, {"a": task, "b": task}, tok, repo[0].parent)
    assert table["as_encoded"] == 1 and table["kinds"]["anchored"] == 2
