from pathlib import Path

import pytest

from envs.registry import Task
from envs.swe.gitrepo import BareRepo
from envs.swe.prompt import build_prompt

BIG = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(60))
SMALL = "def g(x):\n    return x * 2\n"


def make_task(tmp_path: Path, files: dict[str, str]) -> tuple[Task, Path]:
    src = tmp_path / "src"
    for name, text in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(text)
    repos = tmp_path / "repos"
    repo = BareRepo.create(repos / "demo.git")
    commit = repo.commit_directory(src, "snapshot")
    patch = "".join(f"diff --git a/{n} b/{n}\n--- a/{n}\n+++ b/{n}\n@@ -1 +1 @@\n-x\n+y\n" for n in files)
    # The statement names what the retrieval should find: g (in small.py) and f0 (in big.py).
    task = Task("demo__1", "swe", "The function g doubles wrongly, and f0 adds.", repo="demo",
                repo_url="embedded://demo", base_commit=commit, patch=patch)
    return task, repos


def test_retrieved_context_holds_whole_files_in_the_chat_template(tmp_path, chat_tokenizer):
    task, repos = make_task(tmp_path, {"pkg/small.py": SMALL})
    r = build_prompt(task, chat_tokenizer, 4096, "bm25", repos_root=repos)
    assert r.context_files == ["pkg/small.py"] and r.dropped_files == []
    assert r.text.startswith("<|im_start|>system\n") and r.text.endswith("<|im_start|>assistant\n")
    assert f"[start of pkg/small.py]\n{SMALL.rstrip()}\n[end of pkg/small.py]" in r.text
    assert r.token_ids == chat_tokenizer(r.text, add_special_tokens=False)["input_ids"]


def test_files_that_do_not_fit_are_dropped_whole_and_named(tmp_path, chat_tokenizer):
    task, repos = make_task(tmp_path, {"pkg/big.py": BIG, "pkg/small.py": SMALL})
    full = build_prompt(task, chat_tokenizer, 100_000, "bm25", repos_root=repos)
    budget = len(full.token_ids) - 10
    r = build_prompt(task, chat_tokenizer, budget, "bm25", repos_root=repos)
    assert len(r.token_ids) <= budget
    assert r.dropped_files == ["pkg/big.py"] and r.context_files == ["pkg/small.py"]
    assert "def f0(x)" not in r.text  # not even a piece of the dropped file
    assert "Files left out to fit the prompt" in r.text and "pkg/big.py" in r.text
    assert SMALL.rstrip() in r.text


@pytest.mark.parametrize("budget_delta", [100, 130, 160, 250, 400, 1000, 3000])
def test_no_file_is_ever_cut_whatever_the_budget(tmp_path, chat_tokenizer, budget_delta):
    task, repos = make_task(tmp_path, {"pkg/big.py": BIG, "pkg/small.py": SMALL})
    bare = build_prompt(task, chat_tokenizer, 100_000, "none", repos_root=repos)
    budget = len(bare.token_ids) + budget_delta
    r = build_prompt(task, chat_tokenizer, budget, "bm25", repos_root=repos)
    assert len(r.token_ids) <= budget
    for path, text in (("pkg/big.py", BIG), ("pkg/small.py", SMALL)):
        assert (path in r.context_files) == (text.rstrip() in r.text)
        assert (path in r.context_files) != (path in r.dropped_files)


def test_no_checkout_means_no_context_and_none_context_reads_nothing(tmp_path, chat_tokenizer):
    task, _ = make_task(tmp_path, {"pkg/small.py": SMALL})
    r = build_prompt(task, chat_tokenizer, 4096, "bm25", repos_root=tmp_path / "elsewhere")
    assert (r.context_files, r.dropped_files) == ([], [])
    assert "pkg/small.py" not in r.text and "Files left out" not in r.text
    r = build_prompt(task, chat_tokenizer, 4096, "none")
    assert (r.context_files, r.dropped_files) == ([], [])
    assert "<issue>\nThe function g doubles wrongly, and f0 adds.\n</issue>" in r.text


def test_test_files_and_unrelated_files_are_not_retrieved(tmp_path, chat_tokenizer):
    task, repos = make_task(tmp_path, {"pkg/small.py": SMALL, "tests/test_small.py": "def test_g():\n    g(1)\n",
                                       "pkg/other.py": "def h(y):\n    return y\n"})
    r = build_prompt(task, chat_tokenizer, 100_000, "bm25", repos_root=repos)
    assert r.context_files == ["pkg/small.py"]


def test_over_long_statement_is_shortened_visibly(tmp_path, chat_tokenizer):
    task, repos = make_task(tmp_path, {"pkg/small.py": SMALL})
    long = Task(**{**task.__dict__, "problem_statement": "The function g doubles wrongly. " + "word " * 2000})
    budget = len(build_prompt(task, chat_tokenizer, 100_000, "none").token_ids) + 150
    r = build_prompt(long, chat_tokenizer, budget, "bm25", repos_root=repos)
    assert r.statement_truncated and len(r.token_ids) <= budget
    assert r.dropped_files == ["pkg/small.py"]
    assert "the rest of the issue was cut" in r.text
    with pytest.raises(ValueError, match="max_prompt_length=5"):
        build_prompt(long, chat_tokenizer, 5, "none")


def test_a_functions_prompt_shows_at_most_context_functions_of_them_whatever_the_budget(tmp_path, chat_tokenizer):
    import dataclasses

    from envs.swe.env import SweEnvironment

    task, repos = make_task(tmp_path, {"pkg/big.py": BIG, "pkg/small.py": SMALL})
    task = dataclasses.replace(task, problem_statement="Each function of x returns the wrong x.")
    env = SweEnvironment(repos_root=repos)
    shown = {k: env.build_prompt(task, chat_tokenizer, 100_000, "bm25_functions", context_functions=k).context_files
             for k in (1, 3, 12, 40)}
    assert {k: len(v) for k, v in shown.items()} == {1: 1, 3: 3, 12: 12, 40: 40}
    assert shown[1] == shown[3][:1] and shown[3] == shown[12][:3] == shown[40][:3]  # one ranking, cut further on


# Ranked functions of very different sizes, best first: taken greedily in rank order, a long one crowds out the
# short ones after it.
RANKED = [(f"pkg/m.py:{10 * i} h{i}",
           f"def h{i}(x):\n" + "".join(f"    x = x + {j}\n" for j in range(n)) + "    return x")
          for i, n in enumerate([30, 2, 3, 25, 1, 4, 12, 2])]
STATEMENT = "Each of h0 .. h7 returns the wrong x."


def test_the_functions_shown_are_the_set_of_most_worth_that_fits(chat_tokenizer):
    from itertools import combinations

    from envs.swe.prompt import SYSTEM_PROMPT, _render, _user_message, render_prompt

    # Every subset rendered exactly: its length, its worth (1 / (rank + 1) for each function), its labels.
    subsets = []
    for r in range(len(RANKED) + 1):
        for chosen in combinations(range(len(RANKED)), r):
            _, ids = _render(chat_tokenizer, SYSTEM_PROMPT, _user_message(STATEMENT, [RANKED[i] for i in chosen], []))
            subsets.append((len(ids), sum(1 / (i + 1) for i in chosen), [RANKED[i][0] for i in chosen]))
    bare, full = subsets[0][0], subsets[-1][0]
    beat_greedy = 0
    for budget in range(bare, full + 2):
        r = render_prompt(STATEMENT, RANKED, chat_tokenizer, budget, name_omitted=False)
        assert len(r.token_ids) <= budget, budget
        best = max(worth for n, worth, _ in subsets if n <= budget)
        shown = next(worth for _, worth, labels in subsets if labels == r.context_files)
        assert shown == pytest.approx(best), (budget, r.context_files)
        assert r.context_files == [label for label, _ in RANKED if label in r.context_files]  # in rank order
        greedy: list[str] = []
        for label, _ in RANKED:  # what taking them in rank order would have shown
            if next(n for n, _, labels in subsets if labels == [*greedy, label]) <= budget:
                greedy.append(label)
        beat_greedy += shown > next(worth for _, worth, labels in subsets if labels == greedy) + 1e-9
    assert beat_greedy >= 20  # the budgets where a long function no longer crowds out the rest


def test_where_block_counts_understate_the_prompt_is_packed_again_and_the_budget_holds(chat_tokenizer):
    from envs.swe.prompt import render_prompt

    class Understating:
        """The chat tokenizer, but a function's block counted alone at a third of its tokens: the packing's
        estimate far below the rendered prompt, as a tokenizer merging across the joints could give."""

        chat_template = chat_tokenizer.chat_template

        def apply_chat_template(self, *args, **kwargs):
            return chat_tokenizer.apply_chat_template(*args, **kwargs)

        def __call__(self, text, **kwargs):
            out = chat_tokenizer(text, **kwargs)
            return {"input_ids": out["input_ids"][: len(out["input_ids"]) // 3]} if text.startswith("\n[start") else out

    bare = len(render_prompt(STATEMENT, [], chat_tokenizer, 100_000, name_omitted=False).token_ids)
    full = len(render_prompt(STATEMENT, RANKED, chat_tokenizer, 100_000, name_omitted=False).token_ids)
    shown = 0
    for budget in range(bare, full + 2, 3):
        r = render_prompt(STATEMENT, RANKED, Understating(), budget, name_omitted=False)
        assert len(r.token_ids) <= budget, budget
        shown += bool(r.context_files)
    assert shown >= 20  # the budgets that hold functions at all


def test_the_configs_default_function_count_is_the_retrievals() -> None:
    from envs.swe.retrieval import TOP_K_FUNCTIONS
    from fleet.config.env import DatasetConfig

    # Two floors hold the default (fleet.config cannot import envs): a prompt built outside the trainer must match.
    assert DatasetConfig().context_functions == TOP_K_FUNCTIONS
