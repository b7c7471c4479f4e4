"""`grpo-fleet data build --images`: an instance image per task of a built task set, pushed to a registry.

Each task gets `<namespace>/sweb.eval.x86_64.<instance_id>:latest` (SWE-bench's naming, `__` -> `_1776_`): the shared
Debian base (`images.base_tarball`) plus a layer with `/testbed` = the task's repository at its base_commit, history
ending there. Its rows get SWE-bench 5's `image`, `eval_script` (the task's own pytest command with `-rA`, between
the markers) and `log_parser`, written back into the task set's split files, so the fleet runs them on the image
path (`sandbox.image_registry` = the registry pushed to). Rebuilding the task set without `--images` undoes it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envs.registry import Task
from envs.swe.images import OciBuilder, base_tarball, make_testbed
from envs.swe.loaders import load_swebench_file, task_to_row
from envs.swe.paths import repos_dir

log = logging.getLogger(__name__)
SPLITS = ("train", "validation")


@dataclass
class ImageBuildReport:
    images: int
    seconds: float
    registry: str


def image_name(task: Task, namespace: str) -> str:
    return f"{namespace}/sweb.eval.x86_64.{task.instance_id.replace('__', '_1776_')}:latest".lower()


def eval_command(test_command: str) -> str:
    """The task's pytest command with every test reported (`-rA`: swebench's parser reads the PASSED lines)."""
    words = ["-rA" if w.startswith("-r") else w for w in shlex.split(test_command)]
    return shlex.join(words if "-rA" in words else [*words, "-rA"])


def eval_script(task: Task) -> str:
    """An eval script of SWE-bench 5's shape for an embedded task."""
    from fleet.contracts.sandbox import TaskSpec
    from fleet.contracts.swe_eval import derived_eval_script

    command = eval_command(task.test_command or "python -m pytest")
    spec = TaskSpec(repo_url=task.repo_url, base_commit=task.base_commit, patch="", test_patch=task.test_patch,
                    test_command=command, fail_to_pass=list(task.fail_to_pass),
                    pass_to_pass=list(task.pass_to_pass), image="x")
    return derived_eval_script(spec, [])


def _repo_path(task_dir: Path, task: Task) -> Path:
    name = task.repo_url.removeprefix("embedded://").strip("/")
    for candidate in (repos_dir(task_dir) / f"{name}.git", repos_dir(task_dir) / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"task {task.instance_id}: no repository for {task.repo_url} under {repos_dir(task_dir)}")


def build_task_images(task_dir: Path, registry: str, *, namespace: str = "grpo-fleet", tls_verify: bool = True,
                      limit: int | None = None) -> ImageBuildReport:
    """Build, push and record an image for every task (at most `limit` per split)."""
    t0 = time.monotonic()
    done = 0
    with tempfile.TemporaryDirectory(prefix="grpo-images-") as tmp:
        builder = OciBuilder(Path(tmp) / "oci")
        builder.base(base_tarball())
        for split in SPLITS:
            path = task_dir / f"{split}.jsonl"
            if not path.is_file():
                continue
            tasks = load_swebench_file(path)
            rows = []
            for i, task in enumerate(tasks):
                row = task_to_row(task)
                if limit is None or i < limit:
                    row.update(_build_one(builder, Path(tmp), task_dir, task, registry, namespace, tls_verify))
                    done += 1
                rows.append(row)
            _write_rows(path, rows)
    return ImageBuildReport(done, time.monotonic() - t0, registry)


def _build_one(builder: OciBuilder, tmp: Path, task_dir: Path, task: Task, registry: str, namespace: str,
               tls_verify: bool) -> dict[str, Any]:
    testbed = tmp / f"tb-{task.instance_id}"
    make_testbed(_repo_path(task_dir, task), task.base_commit, testbed)
    tag = "t" + hashlib.sha256(task.instance_id.encode()).hexdigest()[:16]
    builder.instance(tag, testbed)
    name = image_name(task, namespace)
    builder.push(tag, f"{registry}/{name}", tls_verify=tls_verify)
    log.info("image %s/%s pushed", registry, name)
    return {"image": name, "eval_script": eval_script(task), "log_parser": "parse_log_pytest",
            "eval_type": "pass_and_fail"}


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
