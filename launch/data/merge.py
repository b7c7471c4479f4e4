"""`grpo-fleet data merge BASE OTHER --out NEW`: one task set from two builds of the same recipe.

A set grows one repository at a time without building it all again: build the repositories to change (more tasks
each, other bug kinds) with `data build --repos ... --max-per-repo ...`, then merge. Every repository OTHER holds
replaces BASE's (its rows in both splits and its bare repository, whose refs are its rows' commits); BASE's other
repositories are kept as they are. NEW is written beside, never over, either input.

Both builds must come from the same recipe (a repository's split, statements and tests follow from it) and the same
test runner (a task's FAIL_TO_PASS ids are its pytest's names). The manifest keeps BASE's fields, OTHER's
per-repository figures for the repositories it brought, and a `merged` entry saying what came from where.
"""

from __future__ import annotations

import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.registry import Task
from envs.swe.paths import repos_dir
from envs.swe.taskset import SPLITS, read_manifest, read_split, write_jsonl, write_manifest


@dataclass(frozen=True)
class MergeReport:
    out: Path
    kept: dict[str, int]  # BASE's repositories kept: tasks each
    replaced: dict[str, int]  # repositories taken from OTHER: tasks each (BASE's count is in the manifest)
    per_split: dict[str, int]


def _repo_name(task: Task) -> str:
    """A built set's rows name their bare repository `embedded://NAME` (`repos/NAME.git`)."""
    return task.repo_url.removeprefix("embedded://").strip("/")


def _load(folder: Path, what: str) -> tuple[dict[str, list[Task]], dict[str, Any]]:
    if not (folder / "train.jsonl").is_file():
        raise FileNotFoundError(f"{what} {folder}: no train.jsonl: not a built task set")
    manifest = read_manifest(folder)
    if not manifest:
        raise ValueError(f"{what} {folder}: no manifest.json: merge needs the recipe and test runner a set was "
                         "built with")
    rows: dict[str, list[Task]] = {split: read_split(folder, split) if (folder / f"{split}.jsonl").is_file() else []
                                   for split in SPLITS}
    return rows, manifest


def merge_tasksets(base: Path, other: Path, out: Path) -> MergeReport:
    """Write NEW = BASE with every repository of OTHER replaced by (or added as) OTHER's; see the module doc."""
    if out.exists():
        raise FileExistsError(f"--out {out} exists: merge writes a new task set and replaces none")
    base_rows, base_manifest = _load(base, "BASE")
    other_rows, other_manifest = _load(other, "OTHER")
    for key in ("recipe_fingerprint", "test_runner"):
        if base_manifest.get(key) != other_manifest.get(key):
            raise ValueError(f"{key} differs: BASE {base} has {base_manifest.get(key)!r}, OTHER {other} has "
                             f"{other_manifest.get(key)!r}; build OTHER with BASE's recipe and interpreter "
                             "(`data build --recipe ... --python ...`)")
    taken = {_repo_name(t) for split in SPLITS for t in other_rows[split]}
    missing = sorted(n for n in taken if not (repos_dir(other) / f"{n}.git").is_dir())
    if missing:
        raise FileNotFoundError(f"OTHER {other}: no bare repository for {', '.join(missing)} under {repos_dir(other)}")
    merged = {split: sorted([t for t in base_rows[split] if _repo_name(t) not in taken] + other_rows[split],
                            key=lambda t: (t.repo, t.instance_id)) for split in SPLITS}
    ids = Counter(t.instance_id for split in SPLITS for t in merged[split])
    clash = sorted(i for i, n in ids.items() if n > 1)
    if clash:
        raise ValueError(f"instance ids twice in the merged set (OTHER's tasks under another repository name?): "
                         f"{', '.join(clash[:5])}")
    kept = Counter(_repo_name(t) for split in SPLITS for t in merged[split] if _repo_name(t) not in taken)

    staging = out.with_name(out.name + ".merging")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _write(staging, base, other, kept, taken, merged, base_manifest, other_manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a half-written set is never left to be mistaken for one
        raise
    staging.rename(out)
    replaced = Counter(_repo_name(t) for split in SPLITS for t in merged[split] if _repo_name(t) in taken)
    return MergeReport(out=out, kept=dict(sorted(kept.items())), replaced=dict(sorted(replaced.items())),
                       per_split={s: len(merged[s]) for s in SPLITS})


def _write(staging: Path, base: Path, other: Path, kept: Counter[str], taken: set[str],
           merged: dict[str, list[Task]], base_manifest: dict[str, Any], other_manifest: dict[str, Any]) -> None:
    repos_dir(staging).mkdir(parents=True)
    for name in sorted(kept):
        shutil.copytree(repos_dir(base) / f"{name}.git", repos_dir(staging) / f"{name}.git", symlinks=True)
    for name in sorted(taken):
        shutil.copytree(repos_dir(other) / f"{name}.git", repos_dir(staging) / f"{name}.git", symlinks=True)
    for split in SPLITS:
        write_jsonl(staging / f"{split}.jsonl", merged[split])
    repos = {n: v for n, v in base_manifest.get("repos", {}).items() if n in kept}
    repos.update({n: v for n, v in other_manifest.get("repos", {}).items() if n in taken})
    manifest = {
        **base_manifest,
        "repos": dict(sorted(repos.items())),
        "tasks": sum(len(merged[s]) for s in SPLITS),
        "merged": [*base_manifest.get("merged", []),
                   {"base": str(base), "other": str(other), "repos": sorted(taken),
                    **{k: other_manifest.get(k) for k in ("max_per_repo", "kinds", "seed", "build_seconds")}}],
    }
    write_manifest(staging, manifest)


def format_merge(report: MergeReport) -> str:
    kept = ", ".join(f"{n} {c}" for n, c in report.kept.items()) or "none"
    replaced = ", ".join(f"{n} {c}" for n, c in report.replaced.items())
    return (f"merged -> {report.out}: {sum(report.per_split.values())} tasks "
            f"({', '.join(f'{s} {n}' for s, n in report.per_split.items())}); from OTHER: {replaced}; "
            f"kept from BASE: {kept}")
