"""Patch extraction from model output: a fenced diff block, `<patch>...</patch>`, or a `submit_patch` tool call.

Outcomes are distinct because they are scored and logged differently:
  ok         a unified diff (hunk headers recounted, so off-by-one counts from a model do not fail `git apply`)
  missing    no patch block at all
  malformed  a complete block whose content is not a unified diff
  truncated  the output ends inside a block (the generation hit its token limit)
  no_change  a unified diff that changes nothing: every hunk adds back exactly the lines it removes. It cannot fix
             anything, and graded it would earn the share of tests that already pass (`pass_rate`): a small model
             learned to answer that way (docs/swe-learning.md). Scored as a format error, never sent to a sandbox.
Several blocks: the last complete one wins (models revise); a trailing unfinished block counts only when there is
no complete one. Without any block, a bare diff in plain text (`diff --git` / `---`+`+++`) is accepted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Literal

PatchStatus = Literal["ok", "missing", "malformed", "truncated", "no_change"]


@dataclass(frozen=True)
class PatchExtraction:
    status: PatchStatus
    patch: str = ""
    source: str = ""
    """diff_fence | patch_tag | tool_call | bare_diff ('' when nothing was found)."""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class MalformedDiff(ValueError):
    pass


@dataclass(frozen=True)
class _Block:
    end: int
    source: str
    content: str | None  # None: the block never closed (truncated)
    error: str = ""


_FENCE_OPEN = re.compile(r"^```[ \t]*([\w+-]*)[^\n]*$")
_DIFF_LANGS = {"diff", "patch", "udiff"}
HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


def _looks_like_diff(text: str) -> bool:
    head = text.lstrip("\n")
    return head.startswith(("diff --git ", "--- ")) or "\n+++ " in head[:2000]


def _fences(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    lines = text.splitlines(keepends=True)
    pos, i = 0, 0
    while i < len(lines):
        m = _FENCE_OPEN.match(lines[i].rstrip("\r\n"))
        pos_after = pos + len(lines[i])
        if not m:
            pos, i = pos_after, i + 1
            continue
        lang = m.group(1).lower()
        body_start, j, body_pos = pos_after, i + 1, pos_after
        while j < len(lines) and lines[j].rstrip() != "```":
            body_pos += len(lines[j])
            j += 1
        closed = j < len(lines)
        body = text[body_start:body_pos]
        is_diff = lang in _DIFF_LANGS or (lang == "" and _looks_like_diff(body))
        if is_diff:
            end = body_pos + len(lines[j]) if closed else len(text)
            blocks.append(_Block(end, "diff_fence", body if closed else None))
        elif not closed and lang == "" and _looks_like_diff(body):
            blocks.append(_Block(len(text), "diff_fence", None))
        # Other languages are skipped whole, so a fence inside them cannot open a diff.
        pos = body_pos + (len(lines[j]) if closed else 0)
        i = j + 1
    return blocks


def _patch_tags(text: str) -> list[_Block]:
    blocks = [_Block(m.end(), "patch_tag", m.group(1)) for m in re.finditer(r"<patch>(.*?)</patch>", text, re.S)]
    last_close = blocks[-1].end if blocks else 0
    if text.find("<patch>", last_close) >= 0:
        blocks.append(_Block(len(text), "patch_tag", None))
    return blocks


def _tool_patch(obj: object) -> str | None:
    """The `patch` argument of a submit_patch call in the common tool-call JSON shapes, else None."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        return _tool_patch(obj["function"])
    if obj.get("name") != "submit_patch":
        return None
    args = obj.get("arguments", obj.get("parameters", obj.get("input")))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    patch = args.get("patch") if isinstance(args, dict) else None
    return patch if isinstance(patch, str) else None


def _tool_calls(text: str) -> list[_Block]:
    blocks: list[_Block] = []
    decoder = json.JSONDecoder()
    covered = 0
    # Only `"name": "submit_patch"` is a call; the bare word in prose is not.
    for m in re.finditer(r'"name"\s*:\s*"submit_patch"', text):
        if m.start() < covered:
            continue
        found = False
        truncated = False
        # The enclosing object starts at one of the nearest `{` before the name (nesting: function -> name).
        starts = [i for i in range(m.start() - 1, max(-1, m.start() - 400), -1) if text[i] == "{"]
        for s in starts:
            try:
                obj, end = decoder.raw_decode(text, s)
            except json.JSONDecodeError as exc:
                truncated |= exc.pos >= len(text) - 1 or "Unterminated" in exc.msg
                continue
            if end > m.start():
                patch = _tool_patch(obj)
                error = "" if patch is not None else "submit_patch call without a string `patch` argument"
                blocks.append(_Block(end, "tool_call", patch if patch is not None else "", error))
                covered, found = end, True
                break
        if not found:
            blocks.append(_Block(len(text), "tool_call", None) if truncated else
                          _Block(m.end(), "tool_call", "", "submit_patch call is not valid JSON"))
    return blocks


def normalize_diff(text: str, *, lenient_tail: bool = False) -> str:
    """A clean unified diff: hunk counts recounted, blank context lines restored, trailing prose dropped if lenient.

    Raises MalformedDiff when there is no file header, no hunk, or a line that belongs to no diff grammar.
    """
    lines = text.replace("\r\n", "\n").strip("\n").split("\n")
    if lines and lines[0].startswith("```"):  # a fence inside <patch> or a tool call
        lines = lines[1:-1] if lines[-1].strip() == "```" else lines[1:]
    out: list[str] = []
    files = hunks = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("diff --git ", "index ", "new file mode", "deleted file mode", "similarity ", "rename ",
                            "old mode", "new mode")):
            out.append(line)
            i += 1
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            out += [line, lines[i + 1]]
            files, i = files + 1, i + 2
        elif HUNK_HEADER.match(line):
            if not files:
                raise MalformedDiff(f"hunk before any ---/+++ file header: {line!r}")
            i = _hunk(lines, i, out)
            hunks += 1
        elif lenient_tail and hunks:
            break
        elif not line.strip() and i == len(lines) - 1:
            i += 1
        else:
            raise MalformedDiff(f"line {i + 1} is not part of a unified diff: {line[:80]!r}")
    if not files or not hunks:
        raise MalformedDiff("no `--- a/...` / `+++ b/...` file header with a hunk")
    return "\n".join(out) + "\n"


def _hunk(lines: list[str], i: int, out: list[str]) -> int:
    m = HUNK_HEADER.match(lines[i])
    assert m is not None
    body: list[str] = []
    j = i + 1
    while j < len(lines):
        line = lines[j]
        # "--- " opens the next file only with its "+++ " line: alone, it is a removed line that starts with "-- "
        # (an SQL or Lua comment, a reST rule).
        next_file = line.startswith("--- ") and j + 1 < len(lines) and lines[j + 1].startswith("+++ ")
        if next_file or line.startswith("diff --git ") or HUNK_HEADER.match(line):
            break
        if line == "":
            # Models (and editors) drop the single space of an empty context line.
            if j == len(lines) - 1 or lines[j + 1][:1] not in (" ", "+", "-", "\\", ""):
                break
            line = " "
        elif line[0] not in " +-\\":
            break
        body.append(line)
        j += 1
    old = sum(1 for b in body if b[0] in " -")
    new = sum(1 for b in body if b[0] in " +")
    if not old and not new:
        raise MalformedDiff(f"empty hunk at {lines[i]!r}")
    old_start, new_start = int(m.group(1)), int(m.group(3))
    out.append(f"@@ -{old_start},{old} +{new_start},{new} @@{m.group(5)}")
    out.extend(body)
    return j


# Header lines that make a patch change something even where its hunks do not: a new, deleted, renamed or copied
# file, a mode change.
_CHANGING_HEADERS = ("new file mode", "deleted file mode", "rename ", "copy ", "similarity ", "old mode", "new mode",
                     "--- /dev/null", "+++ /dev/null")


def changes_nothing(patch: str) -> bool:
    """True when the normalised unified diff `patch` (hunk counts exact, as `normalize_diff` writes them) leaves every
    file as it was: no header that changes a file, each file's old and new path the same, and every hunk's + lines
    equal to its - lines, in order."""
    lines = patch.splitlines()
    old_path = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        m = HUNK_HEADER.match(line)
        if m:  # the body by the header's counts: a removed "-- x" line reads like a file header
            old_left, new_left = int(m.group(2) or 1), int(m.group(4) or 1)
            removed: list[str] = []
            added: list[str] = []
            i += 1
            while i < len(lines) and (old_left or new_left):
                body = lines[i]
                if body.startswith("\\"):
                    return False  # a final newline removed or added
                if body[:1] in (" ", "-"):
                    old_left -= 1
                if body[:1] in (" ", "+"):
                    new_left -= 1
                if body[:1] == "-":
                    removed.append(body[1:])
                elif body[:1] == "+":
                    added.append(body[1:])
                i += 1
            if removed != added or (i < len(lines) and lines[i].startswith("\\")):
                return False
            continue
        if line.startswith(_CHANGING_HEADERS):
            return False
        if line.startswith("--- "):
            old_path = line[4:].removeprefix("a/")
        elif line.startswith("+++ ") and line[4:].removeprefix("b/") != old_path:
            return False
        i += 1
    return True


def extract_patch(text: str) -> PatchExtraction:
    """The answer's patch (the last complete block wins), `ok` or why there is none to grade."""
    found = _extract(text)
    if found.ok and changes_nothing(found.patch):
        return PatchExtraction("no_change", found.patch, found.source,
                               "every hunk adds back the lines it removes: the patch changes nothing")
    return found


def _extract(text: str) -> PatchExtraction:
    blocks = sorted(_fences(text) + _patch_tags(text) + _tool_calls(text), key=lambda b: b.end)
    complete = [b for b in blocks if b.content is not None]
    if complete:
        block = complete[-1]
        if block.error:
            return PatchExtraction("malformed", source=block.source, detail=block.error)
        try:
            return PatchExtraction("ok", normalize_diff(block.content or ""), block.source)
        except MalformedDiff as exc:
            return PatchExtraction("malformed", source=block.source, detail=str(exc))
    if blocks:
        return PatchExtraction("truncated", source=blocks[-1].source, detail="output ends inside an unclosed block")
    start = re.search(r"^(diff --git |--- \S)", text, re.M)
    if start:
        try:
            return PatchExtraction("ok", normalize_diff(text[start.start():], lenient_tail=True), "bare_diff")
        except MalformedDiff as exc:
            return PatchExtraction("malformed", source="bare_diff", detail=str(exc))
    return PatchExtraction("missing", detail="no ```diff block, <patch> tag or submit_patch call")
