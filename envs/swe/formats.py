"""Row parsers of the other SWE dataset formats; each gives the task its environment image.

  swe_gym    SWE-bench rows; image `xingyaoww/sweb.eval.x86_64.<instance_id>` with `__` written `_s_`.
  swe_smith  one image per repo@commit (`image_name`, or `jyangballin/swesmith.x86_64.<owner>_1776_<repo>.<c8>`
             from `repo`); the row's `patch` is the bug: it becomes the task's `setup_patch` (applied and committed
             as the tree's only commit before the agent's patch), and its reverse is the gold patch.
  r2e_gym    `docker_image` (or `namanjain12/<repo_name>_final:<commit_hash>`); the hidden tests live in the image
             (`/r2e_tests`), the row's `expected_output_json` lists the outcome of each test on the fixed tree: the
             ones expected to pass are FAIL_TO_PASS, run by the row's `test_command` (default `bash run_tests.sh`).
Errors are those of `loaders.parse_row`: `row N (id): field F: problem`, all at once.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from envs.registry import Task, TaskDataset
from envs.swe.loaders import dataset_file, load_swebench_file, parse_row

if TYPE_CHECKING:
    from fleet.config.env import DatasetConfig

_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")


def _where(row: dict[str, Any], row_no: int, key: str = "instance_id") -> str:
    iid = row.get(key)
    return f"row {row_no}" + (f" ({iid})" if isinstance(iid, str) and iid else "")


def parse_swe_gym(row: Any, row_no: int) -> tuple[Task | None, list[str]]:
    task, errors = parse_row(row, row_no)
    if task is not None and not task.metadata.get("image"):
        name = task.instance_id.replace("__", "_s_").lower()
        task.metadata["image"] = f"xingyaoww/sweb.eval.x86_64.{name}:latest"
    return task, errors


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


def parse_r2e_gym(row: Any, row_no: int) -> tuple[Task | None, list[str]]:
    if not isinstance(row, dict):
        return None, [f"row {row_no}: expected an object, got {type(row).__name__}"]
    image = row.get("docker_image")
    repo, commit = row.get("repo_name"), row.get("commit_hash")
    where = _where(row, row_no, "docker_image" if image else "repo_name")
    errors: list[str] = []
    if not (isinstance(image, str) and image):
        if isinstance(repo, str) and repo and isinstance(commit, str) and commit:
            image = f"namanjain12/{repo}_final:{commit}"
        else:
            errors.append(f"{where}: field docker_image: missing (and no repo_name + commit_hash to derive it)")
    expected = row.get("expected_output_json")
    try:
        outcomes = json.loads(expected) if isinstance(expected, str) else expected
        if not isinstance(outcomes, dict) or not outcomes:
            raise ValueError
    except ValueError:
        errors.append(f"{where}: field expected_output_json: must be a non-empty JSON object of test -> status")
        outcomes = {}
    statement = row.get("problem_statement")
    if not isinstance(statement, str):
        errors.append(f"{where}: field problem_statement: missing")
    if errors:
        return None, errors
    passing = sorted(t for t, status in outcomes.items() if str(status).upper() in ("PASSED", "PASS"))
    name = str(image).rsplit("/", 1)[-1]
    task = Task(instance_id=str(row.get("instance_id") or name), env_name="swe", problem_statement=str(statement),
                repo=str(repo or name), repo_url=f"image://{image}", base_commit=str(row.get("base_commit") or "HEAD"),
                patch=str(row.get("patch") or ""), fail_to_pass=tuple(passing),
                test_command=str(row.get("test_command") or "bash run_tests.sh"),
                metadata={"image": image, "expected_output": outcomes})
    return task, []


_PARSERS = {"swe_gym": parse_swe_gym, "swe_smith": parse_swe_smith, "r2e_gym": parse_r2e_gym}


def _loader(name: str) -> Any:
    def load(cfg: DatasetConfig, **_: Any) -> TaskDataset:
        file = dataset_file(cfg, name)
        tasks = load_swebench_file(file, parse=_PARSERS[name])
        if cfg.max_samples is not None:
            tasks = tasks[: cfg.max_samples]
        return TaskDataset(name, "swe", tasks, root=file.parent)

    load.__doc__ = f"`data.*.dataset_name={name}`: `data_path` is a task file, or a folder holding `{{split}}.*`."
    return load


load_swe_gym_dataset = _loader("swe_gym")
load_swe_smith_dataset = _loader("swe_smith")
load_r2e_gym_dataset = _loader("r2e_gym")
