"""SWE prompts: the problem statement plus code context, in the tokenizer's chat template, within a token budget.

Context "bm25" is the full text of the repository's source files that best match the problem statement
(`envs/swe/retrieval.py`), read from the task's repository at `base_commit` ("bm25_functions": the best matching
functions and methods instead of whole files, for small budgets); a task with no local checkout (a hub row
whose `repo_url` is a GitHub URL) gets the statement alone. Nothing here reads `task.patch`: the gold patch's files,
names or sizes would tell the policy where the fix is. To fit `max_prompt_length`, whole retrieved files are left out
(and named in the prompt and in `PromptResult.dropped_files`); a file is never cut. Only when the bare statement
alone is over budget is the statement shortened, with a visible marker and `statement_truncated=True`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from envs.registry import PromptResult, Task
from envs.swe.assets import statement_with_image_notes
from envs.swe.gitrepo import BareRepo, GitError
from envs.swe.retrieval import TOP_K_FUNCTIONS, retrieve, retrieve_functions

log = logging.getLogger(__name__)

SYSTEM_PROMPT = (
    "You are an expert software engineer. You get an issue and source files of a Python repository. "
    "Fix the issue by changing the library code (not the tests). Answer with a single unified diff against the "
    "repository root, as `git diff` prints it, inside one ```diff fenced block, and write nothing after it."
)
_TRUNC_MARK = "\n[... the rest of the issue was cut to fit the prompt budget ...]"


def resolve_repo(repo_url: str, repos_root: str | Path | None) -> BareRepo | None:
    """The local git repository of a task URL: `embedded://NAME` under repos_root, `file://PATH`, or a path."""
    if repo_url.startswith("embedded://"):
        return BareRepo(Path(repos_root) / f"{repo_url.removeprefix('embedded://')}.git") if repos_root else None
    path = Path(repo_url.removeprefix("file://"))
    if path.exists():
        return BareRepo(path / ".git" if (path / ".git").is_dir() else path)
    return None


def _render(tokenizer: Any, system: str, user: str) -> tuple[str, list[int]]:
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        # Tokenizers without a chat template (small test tokenizers): a plain layout the model can still learn.
        text = f"{system}\n\n{user}\n\nAnswer:\n"
        ids = tokenizer(text)["input_ids"]
    return text, list(ids)


def _block(path: str, text: str) -> str:
    return f"[start of {path}]\n{text.rstrip()}\n[end of {path}]"


def _user_message(statement: str, files: list[tuple[str, str]], omitted: list[str]) -> str:
    parts = [f"<issue>\n{statement.strip()}\n</issue>"]
    if files:
        body = "\n".join(_block(path, text) for path, text in files)
        parts.append(f"<code>\n{body}\n</code>")
    if omitted:
        parts.append("Files left out to fit the prompt (read them mentally as unchanged): " + ", ".join(omitted))
    return "\n\n".join(parts)


def context_files(task: Task, repos_root: str | Path | None, context: str = "bm25",
                  functions: int = TOP_K_FUNCTIONS) -> list[tuple[str, str]]:
    """(path, text) of the source files retrieved for the task's statement (`bm25`), or (`path:line qualname`,
    source) of its best `functions` functions (`bm25_functions`); none without a local checkout."""
    repo = resolve_repo(task.repo_url, repos_root)
    if repo is None:
        return []
    try:
        if context == "bm25_functions":
            return retrieve_functions(repo, task.base_commit, task.problem_statement, k=functions)
        return retrieve(repo, task.base_commit, task.problem_statement)
    except GitError as exc:  # a checkout without this base_commit: the statement alone, said once per task
        log.warning("task %s: no code context (%s)", task.instance_id, exc)
        return []


def build_prompt(
    task: Task,
    tokenizer: Any,
    max_prompt_length: int,
    context: str = "bm25",
    *,
    repos_root: str | Path | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    functions: int = TOP_K_FUNCTIONS,
) -> PromptResult:
    if context not in ("bm25", "bm25_functions", "none"):
        raise ValueError(f"context must be 'bm25', 'bm25_functions' or 'none', got {context!r}")
    files = context_files(task, repos_root, context, functions) if context != "none" else []
    # Files left out are named (a reader knows what exists); functions left out are not: a ranked selection of a
    # repository's functions is partial by nature, and a dozen names would take the budget of a function.
    return render_prompt(statement_with_image_notes(task), files, tokenizer, max_prompt_length,
                         name_omitted=context == "bm25", system_prompt=system_prompt, task_id=task.instance_id)


def render_prompt(
    statement: str,
    files: list[tuple[str, str]],
    tokenizer: Any,
    max_prompt_length: int,
    *,
    name_omitted: bool,
    system_prompt: str = SYSTEM_PROMPT,
    task_id: str = "",
) -> PromptResult:
    """The prompt of a statement and its ranked context (files or functions, best first) within the budget: each
    context entry in whole or left out (and named when `name_omitted`). Files go greedily in rank order, as
    SWE-bench's bm25 prompts take them; functions, many and small, are packed (`_pack`)."""
    dropped: list[str] = []
    text, ids = _render(tokenizer, system_prompt, _user_message(statement, [], [p for p, _ in files if name_omitted]))
    if len(ids) > max_prompt_length:
        return _truncated_statement(statement, task_id, tokenizer, max_prompt_length, system_prompt,
                                    [p for p, _ in files if name_omitted])
    kept: list[tuple[str, str]] = []
    if name_omitted:
        for i, (path, body) in enumerate(files):
            # Greedy in rank order: a file goes in whole if it fits next to those already in, else it is named only.
            omitted = dropped + [p for p, _ in files[i + 1:]]
            _, trial_ids = _render(tokenizer, system_prompt, _user_message(statement, [*kept, (path, body)], omitted))
            if len(trial_ids) <= max_prompt_length:
                kept.append((path, body))
            else:
                dropped = [*dropped, path]
        text, ids = _render(tokenizer, system_prompt, _user_message(statement, kept, dropped))
    else:
        kept, dropped, (text, ids) = _pack(statement, files, tokenizer, max_prompt_length, system_prompt, (text, ids))
    return PromptResult(ids, text, [p for p, _ in kept], dropped)


# A ranked function's worth to a prompt: 1 / (rank + 1), the chance it is the one a fix changes falling with its
# rank as retrieval's hits do. Integers, so that ties (and so the choice) never depend on float rounding.
_WORTH = 10**9


Rendered = tuple[str, list[int]]


def _pack(statement: str, files: list[tuple[str, str]], tokenizer: Any, budget: int, system_prompt: str,
          bare: Rendered) -> tuple[list[tuple[str, str]], list[str], Rendered]:
    """The ranked functions (best first) a prompt of `budget` tokens shows: of the sets that fit, the one whose
    summed worth (1 / (rank + 1) each) is largest, shown in rank order.

    Taking them greedily in rank order let one long function crowd out the several after it. Of the speedrun's 287
    held-out prompts, those showing the lines their fix changes: 192 -> 201 at 1,792 tokens, 232 -> 249 at 4,096
    (`benchmarks/prompt_fix_shown.py`; the worth was chosen on the training tasks). A 0/1 knapsack over each
    function's own token count (`bare`: the statement-only prompt, rendered); the joints between blocks can move the
    rendered count by a few tokens, so the choice is rendered and, while it is over, made again within what the
    overshoot leaves. Returns the choice, the functions left out and the prompt rendered."""
    if not files:
        return [], [], bare
    sizes = [len(tokenizer("\n" + _block(path, body), add_special_tokens=False)["input_ids"]) for path, body in files]
    # The <code> wrapper's tokens, from the first function rendered alone.
    _, one = _render(tokenizer, system_prompt, _user_message(statement, files[:1], []))
    n_bare = len(bare[1])
    room = budget - n_bare - max(0, len(one) - n_bare - sizes[0])
    worth = [_WORTH // (rank + 1) for rank in range(len(files))]
    while True:
        chosen: list[int] = []
        if room > 0:
            best = np.zeros(room + 1, dtype=np.int64)  # best[c]: the most worth within c tokens
            took = np.zeros((len(files), room + 1), dtype=bool)
            for i, n in enumerate(sizes):
                if n <= room:
                    with_it = best[: room + 1 - n] + worth[i]
                    took[i, n:] = with_it > best[n:]  # strictly: at a tie the set without this later-ranked one stays
                    best[n:] = np.where(took[i, n:], with_it, best[n:])
            c = room
            for i in range(len(files) - 1, -1, -1):
                if took[i, c]:
                    chosen.append(i)
                    c -= sizes[i]
            chosen.reverse()
        kept = [files[i] for i in chosen]
        text, ids = _render(tokenizer, system_prompt, _user_message(statement, kept, []))
        if len(ids) <= budget or not kept:
            return kept, [path for i, (path, _) in enumerate(files) if i not in chosen], (text, ids)
        room -= len(ids) - budget


def _truncated_statement(
    statement: str, task_id: str, tokenizer: Any, budget: int, system_prompt: str, dropped: list[str]
) -> PromptResult:
    lo, hi = 0, len(statement)
    best: tuple[str, list[int]] | None = None
    while lo <= hi:  # longest statement prefix (plus marker) that fits
        mid = (lo + hi) // 2
        text, ids = _render(tokenizer, system_prompt, _user_message(statement[:mid] + _TRUNC_MARK, [], dropped))
        if len(ids) <= budget:
            best, lo = (text, ids), mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise ValueError(f"max_prompt_length={budget} cannot hold even the instructions of task {task_id}; "
                         "raise data.*.max_prompt_length")
    return PromptResult(best[1], best[0], [], dropped, statement_truncated=True)
