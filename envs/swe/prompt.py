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
    context entry in whole, greedily in rank order, or left out (and named when `name_omitted`)."""
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
    else:
        kept, dropped = _fit(statement, files, tokenizer, max_prompt_length, system_prompt, len(ids))
    text, ids = _render(tokenizer, system_prompt, _user_message(statement, kept, dropped if name_omitted else []))
    if not name_omitted and len(ids) > max_prompt_length:  # a joint moved a count past `_JOINT_SLACK`: fit exactly
        kept, dropped = _fit_exhaustive(statement, files, tokenizer, max_prompt_length, system_prompt)
        text, ids = _render(tokenizer, system_prompt, _user_message(statement, kept, []))
    return PromptResult(ids, text, [p for p, _ in kept], dropped)


# Tokens a block's count alone may differ by from what it adds to the prompt: byte-level BPE merges only within a
# pre-token, and the joints ("]" + "\n" + "[start of") change at most a token or two.
_JOINT_SLACK = 8


def _fit(statement: str, files: list[tuple[str, str]], tokenizer: Any, budget: int, system_prompt: str,
         bare: int) -> tuple[list[tuple[str, str]], list[str]]:
    """The same greedy choice as rendering the whole prompt for every candidate (each entry in whole if it fits
    beside those already in, in rank order), with far fewer renders: the prompt's length is kept as bounds, moved by
    each entry's own token count, and rendered only when the bounds cannot tell whether the next one fits (a
    4,096-token prompt of 32 functions took 34 renders). `bare`: the statement-only prompt's length."""
    kept: list[tuple[str, str]] = []
    dropped: list[str] = []
    lo = hi = bare
    for path, body in files:
        if kept:
            n = len(tokenizer("\n" + _block(path, body), add_special_tokens=False)["input_ids"])
            if lo + n - _JOINT_SLACK > budget:
                dropped.append(path)
                continue
            if hi + n + _JOINT_SLACK <= budget:
                kept.append((path, body))
                lo, hi = lo + n - _JOINT_SLACK, hi + n + _JOINT_SLACK
                continue
        _, trial = _render(tokenizer, system_prompt, _user_message(statement, [*kept, (path, body)], []))
        if len(trial) <= budget:
            kept.append((path, body))
            lo = hi = len(trial)
        else:
            dropped.append(path)
    return kept, dropped


def _fit_exhaustive(statement: str, files: list[tuple[str, str]], tokenizer: Any, budget: int, system_prompt: str
                    ) -> tuple[list[tuple[str, str]], list[str]]:
    """`_fit`'s choice made by rendering the whole prompt for every candidate: where its bounds failed, and the
    reference it is checked and timed against (tests/unit/envs/test_prompt.py, benchmarks/prompt_build_bench.py)."""
    kept: list[tuple[str, str]] = []
    dropped: list[str] = []
    for path, body in files:
        _, trial = _render(tokenizer, system_prompt, _user_message(statement, [*kept, (path, body)], []))
        (kept.append((path, body)) if len(trial) <= budget else dropped.append(path))
    return kept, dropped


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
