"""SFT examples of the SWE speedrun (CPU): generated fixes, as the policy will see and answer them in GRPO.

Each example is a task of the SFT task set (`sft.yaml`, built by `grpo-fleet data build`: the builder's mutation
kinds applied to packages outside the evaluation repositories, each bug validated by its failing tests, the problem
statement written from them). Prompt: `envs.swe.prompt.build_prompt`, the project's single-shot SWE prompt in the
speedrun tokenizer's chat template with the same context and budget GRPO uses. Completion: the fixing diff in one
```diff fence, which is the answer format the prompt asks for (`envs/swe/patch.py` reads it back).

An example whose prompt does not show the lines the fix changes is left out (the counts say how many): a model
cannot read the fix off code it was not shown, and training it to write such diffs anyway teaches it to invent
context lines. (This reads the gold patch to choose training data; no prompt contains anything from it.)
"""

from __future__ import annotations

import json
import lzma
from collections import Counter
from pathlib import Path
from typing import Any


def completion(patch: str) -> str:
    return f"```diff\n{patch.rstrip()}\n```"


def removed_lines(patch: str) -> list[str]:
    return [line[1:] for line in patch.splitlines() if line.startswith("-") and not line.startswith("---")]


def fix_visible(prompt_text: str, patch: str) -> bool:
    """Whether every line the fix removes or changes is in the prompt (a pure insertion needs its hunk's context)."""
    lines = removed_lines(patch) or [line[1:] for line in patch.splitlines()
                                     if line.startswith(" ") and line[1:].strip()][:3]
    return bool(lines) and all(line in prompt_text for line in lines)


def build(task_dir: Path, tokenizer_dir: Path, out: Path, *, max_prompt_length: int, context: str,
          splits: tuple[str, ...] = ("train", "validation")) -> dict[str, Any]:
    """Write `out` (JSONL, xz) of {"instance_id", "repo", "bug_kind", "prompt", "completion"}; return the counts."""
    from transformers import AutoTokenizer

    from envs.swe.prompt import build_prompt
    from envs.swe.taskset import read_split

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    counts: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(out, "wt") as f:
        for split in splits:
            for task in read_split(task_dir, split):
                r = build_prompt(task, tok, max_prompt_length, context, repos_root=task_dir / "repos")
                counts["tasks"] += 1
                if not fix_visible(r.text, task.patch):
                    counts["fix_not_in_prompt"] += 1
                    continue
                counts["examples"] += 1
                kind = str(task.metadata.get("bug_kind", ""))
                kinds[kind] += 1
                f.write(json.dumps({"instance_id": task.instance_id, "repo": task.repo, "bug_kind": kind,
                                    "prompt": r.text, "completion": completion(task.patch)}) + "\n")
    return {**counts, "bug_kinds": dict(kinds), "max_prompt_length": max_prompt_length, "context": context}


def read(path: Path) -> list[dict[str, str]]:
    with lzma.open(path, "rt") as f:
        return [json.loads(line) for line in f]
