"""Why held-out answers fail (issue 33): each logged validation answer read against its task's code.

The sandbox's verdict says *that* a patch did not apply; this says *why*, per hunk, from the file at the task's base
commit, and whether the answer went for the bug at all:

  format       the answer held no usable diff (`missing`, `malformed`, `truncated`: `envs.swe.patch`)
  path         a file the diff names does not exist at the base commit
  invented     a context or removed line is nowhere in the file (`in_prompt`: it is in the prompt, so it was
               copied from another function or file; otherwise the model made it up)
  whitespace   every line is in the file once whitespace is ignored, but not as written
  scattered    every line is in the file, but not as one block (a line skipped, repeated or reordered)
  anchored     each hunk's old side is a block of the file: the hunk applies there

and, for every diff: whether it edits the gold patch's file, removes the line(s) the gold patch removes, writes the
line(s) the gold patch adds, and changes nothing (`no_op`: its + lines equal its - lines).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.swe.gitrepo import BareRepo
from envs.swe.patch import HUNK_HEADER, extract_patch

KINDS = ("format", "path", "invented", "whitespace", "scattered", "anchored")


@dataclass(frozen=True)
class Hunk:
    path: str  # the file the old side must match (the new path for a file the diff creates)
    old: list[str]  # context and removed lines, in order
    removed: list[str]
    added: list[str]
    new_file: bool = False


@dataclass
class Diagnosis:
    kind: str
    detail: str = ""
    in_prompt: bool | None = None  # for `invented`: the first invented line is in the prompt
    gold_file: bool = False
    gold_removed: bool = False
    gold_added: bool = False
    no_op: bool = False
    hunks: int = 0


def _strip_prefix(name: str, prefix: str) -> str:
    name = name.strip()
    return name[len(prefix):] if name.startswith(prefix) else name


def hunks(patch: str) -> list[Hunk]:
    """The hunks of a normalised unified diff (`extract_patch(...).patch`), each with its file's path."""
    out: list[Hunk] = []
    lines = patch.splitlines()
    path, new_file = "", False
    current: Hunk | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            # A file header, not a removed line that starts with "-- ": the pair is what makes it one.
            old, new = _strip_prefix(line[4:], "a/"), _strip_prefix(lines[i + 1][4:], "b/")
            new_file = old == "/dev/null"
            path, current = (new if new_file else old), None
            i += 2
            continue
        if line.startswith("diff --git "):
            current = None
        elif HUNK_HEADER.match(line):
            current = Hunk(path, [], [], [], new_file)
            out.append(current)
        elif current is not None and line[:1] in (" ", "-", "+"):
            body = line[1:]
            if line[0] != "+":
                current.old.append(body)
            if line[0] == "-":
                current.removed.append(body)
            elif line[0] == "+":
                current.added.append(body)
        i += 1
    return out


def _contains_block(lines: list[str], block: list[str]) -> bool:
    n = len(block)
    return n == 0 or any(lines[i:i + n] == block for i in range(len(lines) - n + 1))


def _hunk_kind(file_lines: list[str], hunk: Hunk) -> tuple[str, str]:
    """(kind, the first line at fault) of one hunk against its file's lines."""
    have = set(file_lines)
    missing = [line for line in hunk.old if line not in have]
    if missing:
        stripped = {line.strip() for line in file_lines}
        if all(line.strip() in stripped for line in missing):
            return "whitespace", missing[0]
        return "invented", next(line for line in missing if line.strip() not in stripped)
    if not _contains_block(file_lines, hunk.old):
        return "scattered", hunk.old[0] if hunk.old else ""
    return "anchored", ""


def diagnose(answer: str, gold_patch: str, read_file: Callable[[str], str | None], prompt: str = "") -> Diagnosis:
    """`read_file(path)` -> the file's text at the base commit, or None where there is none."""
    extracted = extract_patch(answer)
    if not extracted.patch:  # a diff that changes nothing is still read: where it points says what the model tried
        return Diagnosis("format", extracted.status)
    mine, gold = hunks(extracted.patch), hunks(gold_patch)
    gold_paths = {h.path for h in gold}
    gold_removed = [line for h in gold for line in h.removed]
    gold_added = [line for h in gold for line in h.added]
    my_removed = {line.strip() for h in mine for line in h.removed}
    my_added = {line.strip() for h in mine for line in h.added}
    d = Diagnosis("anchored", hunks=len(mine),
                  gold_file=any(h.path in gold_paths for h in mine),
                  gold_removed=bool(gold_removed) and all(line.strip() in my_removed for line in gold_removed),
                  gold_added=bool(gold_added) and all(line.strip() in my_added for line in gold_added),
                  no_op=all(h.removed == h.added for h in mine))
    worst = KINDS.index("anchored")
    for h in mine:
        text = read_file(h.path)
        if h.new_file:
            kind, detail = ("path", h.path) if text is not None else ("anchored", "")  # creating a file that exists
        elif text is None:
            kind, detail = "path", h.path
        else:
            kind, detail = _hunk_kind(text.split("\n"), h)
        if KINDS.index(kind) < worst:
            worst, d.detail = KINDS.index(kind), detail
            d.in_prompt = (detail in prompt) if kind == "invented" and prompt else None
    d.kind = KINDS[worst]
    return d


def repo_reader(git_dir: Path, commit: str) -> Callable[[str], str | None]:
    """path -> the file's text at `commit` (None where there is none), each file read once."""
    return functools.cache(functools.partial(BareRepo(git_dir).try_show, commit))


def round_table(rounds: list[dict[str, Any]], tasks: dict[str, Any], tokenizer: Any, repos: Path,
                prompts: dict[str, str] | None = None, examples: int = 3) -> list[dict[str, Any]]:
    """Per validation round with logged answers (`validation_tasks` of gpu_fleet_swe.py's report): the kinds, how
    each kind was scored, the gold-patch flags, and a few answers of each kind."""
    out = []
    readers: dict[str, Callable[[str], str | None]] = {}  # a task's files are read once for all its rounds
    # An answer that does not end on an end token ran into the generation limit: a policy that degenerates into
    # repeating itself (the sixth run's held-out answers, 5 -> 79) shows here first.
    # `as_encoded`: answers whose ids are this tokenizer's own encoding of their text. A model trained on this
    # tokenizer's encodings writes most of its greedy answers so (runs 7-8: 210-269 of 286); one trained on another
    # split writes none (the ninth run, whose model folder loaded Qwen2's split: 0 of 286).
    ends = {i for i in (tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>"))
            if isinstance(i, int) and i != tokenizer.unk_token_id}
    for r in rounds:
        answers: dict[str, list[int]] = r.get("answers", {})
        if not answers:
            continue
        kinds: Counter[str] = Counter()
        by_verdict: Counter[str] = Counter()
        flags: Counter[str] = Counter()
        samples: dict[str, list[dict[str, Any]]] = {}
        # Per repository: [answers naming the gold patch's file, answers]. A held-out package's name is copied off
        # the prompt's headers for some repositories and never for others (the seventh run: 4 of 8 never).
        by_repo: dict[str, list[int]] = {}
        unfinished = as_encoded = 0
        for task_id, ids in sorted(answers.items()):
            unfinished += int(not ids or ids[-1] not in ends)
            body = ids[:-1] if ids and ids[-1] in ends else ids
            as_encoded += int(tokenizer(tokenizer.decode(body), add_special_tokens=False)["input_ids"] == body)
            task = tasks[task_id]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            prompt = (prompts or {}).get(task_id, "")
            if task_id not in readers:
                readers[task_id] = repo_reader(repos / f"{task.repo}.git", task.base_commit)
            d = diagnose(text, task.patch, readers[task_id], prompt)
            kind = d.kind if d.kind != "invented" or d.in_prompt is None else (
                "invented_from_prompt" if d.in_prompt else "invented_elsewhere")
            kinds[kind] += 1
            by_verdict[f"{kind}/{r['verdicts'].get(task_id, '?')}"] += 1
            for name in ("gold_file", "gold_removed", "gold_added", "no_op"):
                flags[name] += int(getattr(d, name))
            named = by_repo.setdefault(task.repo, [0, 0])
            named[0] += int(d.gold_file)
            named[1] += 1
            if len(samples.setdefault(kind, [])) < examples:
                samples[kind].append({"task": task_id, "detail": d.detail, "answer": text[-1200:]})
        out.append({"step": r["step"], "answers": len(answers), "kinds": dict(kinds.most_common()),
                    "kinds_by_verdict": dict(sorted(by_verdict.items())), "gold": dict(flags),
                    "gold_file_by_repo": dict(sorted(by_repo.items())),
                    "unfinished": unfinished, "as_encoded": as_encoded, "examples": samples})
    return out
