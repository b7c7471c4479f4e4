"""A built task set on disk, and the `swe_embedded` dataset that reads it.

Layout of a task-set folder (default `envs.swe.paths.default_task_dir()`):
  train.jsonl, validation.jsonl   SWE-bench rows (+ repo_url, test_command, test_files, bug_kind, function, split)
  repos/NAME.git                  bare repositories; every task's base_commit is reachable from refs/heads/task/ID
  manifest.json                   recipe fingerprint, seed, per-repository figures (how the set was made)
Point `sandbox.repos_root` at `repos/` (the executor resolves `embedded://NAME` there).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.registry import Task, TaskDataset
from envs.swe.loaders import load_swebench_file, task_to_row
from envs.swe.paths import default_task_dir, repos_dir

if TYPE_CHECKING:
    from fleet.config.env import DatasetConfig

SPLITS = ("train", "validation")
MANIFEST = "manifest.json"


def write_jsonl(path: Path, tasks: list[Task]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for task in tasks:
            f.write(json.dumps(task_to_row(task), sort_keys=True, ensure_ascii=False) + "\n")
    os.replace(tmp, path)  # readers never see a half-written split


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / MANIFEST)


def read_manifest(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def read_split(folder: str | Path, split: str) -> list[Task]:
    path = Path(folder) / f"{split}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: build the task set first (`grpo-fleet data build --out {folder}`)")
    return load_swebench_file(path)


def load_embedded_dataset(cfg: DatasetConfig, **_: Any) -> TaskDataset:
    """`data.*.dataset_name=swe_embedded`: the built task set at `data_path` (default `.cache/tasks`)."""
    folder = task_dir_of(cfg)
    split = "validation" if cfg.split == "test" else cfg.split
    tasks = read_split(folder, split)
    if cfg.max_samples is not None:
        tasks = tasks[: cfg.max_samples]
    return TaskDataset("swe_embedded", "swe", tasks, root=folder)


def task_dir_of(cfg: DatasetConfig) -> Path:
    return Path(cfg.data_path).expanduser() if cfg.data_path else default_task_dir()


def summarize(folder: str | Path) -> dict[str, Any]:
    """Counts per split, repository and bug kind of a built task set."""
    per_repo: Counter[str] = Counter()
    per_kind: Counter[str] = Counter()
    per_split: Counter[str] = Counter()
    repo_kind: Counter[tuple[str, str]] = Counter()
    functions: set[str] = set()
    for split in SPLITS:
        path = Path(folder) / f"{split}.jsonl"
        if not path.is_file():
            continue
        for task in load_swebench_file(path):
            kind = str(task.metadata.get("bug_kind", "?"))
            per_split[split] += 1
            per_repo[task.repo] += 1
            per_kind[kind] += 1
            repo_kind[(task.repo, kind)] += 1
            functions.add(f"{task.repo}:{task.metadata.get('function', task.instance_id)}")
    return {"per_split": dict(per_split), "per_repo": dict(per_repo), "per_kind": dict(per_kind),
            "repo_kind": repo_kind, "functions": len(functions), "total": sum(per_split.values()),
            "manifest": read_manifest(folder), "repos_root": str(repos_dir(folder))}


def format_summary(summary: dict[str, Any]) -> str:
    repos = sorted(summary["per_repo"])
    kinds = sorted(summary["per_kind"])
    width = max([len(k) for k in kinds] + [9])
    lines = [f"tasks: {summary['total']}  ({', '.join(f'{k} {v}' for k, v in sorted(summary['per_split'].items()))})"
             f"  functions: {summary['functions']}  repos_root: {summary['repos_root']}", ""]
    lines.append("per repository:")
    lines += [f"  {r:<12} {summary['per_repo'][r]:>5}" for r in repos]
    lines += ["", "per bug kind:"]
    lines += [f"  {k:<{width}} {summary['per_kind'][k]:>5}" for k in kinds]
    lines += ["", "repository x bug kind:", "  " + " " * width + "".join(f"{r[:10]:>11}" for r in repos)]
    for k in kinds:
        lines.append(f"  {k:<{width}}" + "".join(f"{summary['repo_kind'].get((r, k), 0):>11}" for r in repos))
    manifest = summary.get("manifest") or {}
    if manifest:
        lines += ["", f"built with seed {manifest.get('seed')}, recipe {manifest.get('recipe_fingerprint')} "
                      f"(version {manifest.get('recipe_version')}) in {manifest.get('build_seconds', '?')} s"]
    return "\n".join(lines)
