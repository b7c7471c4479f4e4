"""SWE-smith rows: one image per repo@commit holding the clean repository; the row's `patch` is the bug.

The bug becomes the task's `setup_patch` (applied and committed as the tree's only commit before the agent's patch),
its reverse is the gold patch. The image is `image_name`, or `jyangballin/swesmith.x86_64.<owner>_1776_<repo>.<c8>`
derived from `repo`.
"""

from __future__ import annotations

import re
from typing import Any

from envs.registry import Task
from envs.swe.loaders import parse_row

_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")


def _where(row: dict[str, Any], row_no: int, key: str = "instance_id") -> str:
    iid = row.get(key)
    return f"row {row_no}" + (f" ({iid})" if isinstance(iid, str) and iid else "")


def reverse_patch(text: str) -> str:
    """The inverse of a unified (git) diff: what undoes it."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:], lines[i + 1][4:]
            swap = {"a/": "b/", "b/": "a/"}
            out += [f"--- {swap.get(new[:2], new[:2])}{new[2:]}" if new != "/dev/null" else "--- /dev/null",
                    f"+++ {swap.get(old[:2], old[:2])}{old[2:]}" if old != "/dev/null" else "+++ /dev/null"]
            i += 2
            continue
        m = _HUNK.match(line)
        if m:
            out.append(f"@@ -{m.group(2)} +{m.group(1)} @@{m.group(3)}")
        elif line.startswith("new file mode"):
            out.append("deleted" + line[3:])
        elif line.startswith("deleted file mode"):
            out.append("new" + line[7:])
        elif line.startswith("diff --git ") or line.startswith("index "):
            out.append(line)
        elif line.startswith("+"):
            out.append("-" + line[1:])
        elif line.startswith("-"):
            out.append("+" + line[1:])
        else:
            out.append(line)
        i += 1
    return "\n".join(out) + "\n"


def parse_swe_smith(row: Any, row_no: int) -> tuple[Task | None, list[str]]:
    if not isinstance(row, dict):
        return None, [f"row {row_no}: expected an object, got {type(row).__name__}"]
    where = _where(row, row_no)
    repo = row.get("repo")
    image = row.get("image_name")
    errors = [] if isinstance(image, str) and image or isinstance(repo, str) and repo else \
        [f"{where}: field image_name: missing (and no repo to derive it from)"]
    full = {**row, "base_commit": row.get("base_commit") or "HEAD", "repo": repo or image or "?"}
    task, row_errors = parse_row(full, row_no)
    errors += row_errors
    if task is None or errors:
        return None, errors
    bug = task.patch
    if not image:
        slug = str(repo).removeprefix("swesmith/").replace("__", "_1776_")
        image = f"jyangballin/swesmith.x86_64.{slug}".lower()
    meta = {**task.metadata, "image": image, "setup_patch": bug}
    return Task(**{**task.__dict__, "patch": reverse_patch(bug), "metadata": meta}), []
