"""R2E-Gym rows (R2E-Gym-Subset's layout), graded the way R2E-Gym's own runtime (`agenthub/runtime/docker.py`) does.

A row: `repo_name`, `docker_image`, `commit_hash`, `parsed_commit_content` (JSON text of R2E's `ParsedCommit`),
`execution_result_content`, `modified_files`, `modified_entity_summaries`, `relevant_files`, `num_non_test_*`,
`prompt`, `problem_statement`, `expected_output_json` (JSON text: R2E test key -> status on the fixed tree). No
instance id, no patch and no test command: R2E derives them, and so does this loader, at load time:
- gold patch: `ParsedCommit.get_patch(test_file=False)` (R2E's `Trajectory.gt_patch`): the non-test Python files of
  the commit, each file written as R2E's `FileDiff.get_patch` writes it.
- eval script: `DockerRuntime.setup_env` then `run_tests` as one bash script of SWE-bench 5's shape: the venv links,
  the `.pyc` sweep, `/testbed/run_tests.sh` moved to `/root`, the hidden tests moved from `/r2e_tests` to
  `/root/r2e_tests` and linked in as `/testbed/r2e_tests`, R2E's PATH; then `bash /root/run_tests.sh` between the
  markers.
- grading: R2E's `parse_log_fn(repo_name)` (log parser `r2e_parse_log_pytest`) and its exact-match rule against
  `expected_output_json` (`expected_status`: FAILED outcomes included, no test more or less).
Refused at load time (`Unsupported`): a `repo_name` R2E has no parser for, and images R2E grades the SWE-bench way.
"""

from __future__ import annotations

import json
import re
from typing import Any

from envs.registry import Task
from envs.swe.loaders import Unsupported

R2E_REPOS = ("sympy", "pandas", "pillow", "scrapy", "pyramid", "tornado", "datalad", "aiohttp", "coveragepy", "numpy",
             "orange3")
"""`repo_name`s R2E's `parse_log_fn` knows (the sandbox's parser module holds the same list; a test checks)."""
LOG_PARSER = "r2e_parse_log_pytest"
DOCKER_PATH = "/root/.venv/bin:/root/.local/bin:/root/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:" \
              "/sbin:/bin"
"""The PATH R2E's `DockerRuntime.run` gives every command (the image's own PATH is replaced)."""
_FAMILY = "R2E-Gym"

# `DockerRuntime.setup_env` (each step one `run`, failures ignored) and `run_tests`, in order. The one addition: an
# agent patch is applied before these steps here (after them in R2E), so a `/testbed/r2e_tests` it made is removed
# rather than moved over the real tests.
_SETUP = [
    "ln -s /testbed/.venv /root/.venv",
    "ln -s /testbed/.venv/bin/python /root/.local/bin/python",
    "ln -s /testbed/.venv/bin/python /root/.local/bin/python3",
    "find /testbed/.venv/bin -type f -executable -exec ln -sf {} /root/.local/bin/ \\;",
    "find . -name '*.pyc' -delete",
    "find . -name '__pycache__' -exec rm -rf {} +",
    "find /r2e_tests -name '*.pyc' -delete",
    "find /r2e_tests -name '__pycache__' -exec rm -rf {} +",
    "mv /testbed/run_tests.sh /root/run_tests.sh",
    "rm -rf /testbed/r2e_tests",
    "mv /r2e_tests /root/r2e_tests",
    "ln -s /root/r2e_tests /testbed/r2e_tests",
]


def eval_script() -> str:
    """R2E's setup and test run as a SWE-bench 5 eval script (markers from swebench, stderr merged by the caller)."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    lines = ["#!/bin/bash", "set -uxo pipefail", "cd /testbed", f"export PATH={DOCKER_PATH}", *_SETUP,
             f": '{START_TEST_OUTPUT}'", "bash /root/run_tests.sh", f": '{END_TEST_OUTPUT}'"]
    return "\n".join(lines) + "\n"


def _is_test_file(path: str) -> bool:
    """R2E's `FileDiff.is_test_file`."""
    parts = path.split("/")
    return (path.endswith("_test.py") or path.startswith("test_") or parts[-1].startswith("test_")
            or any(d in parts for d in ("tests", "Tests", "test", "Test")))


def _range(r: dict[str, Any]) -> str:
    return f"{r['start']}" if r.get("length") is None else f"{r['start']},{r['length']}"


_LINE_PREFIX = {"context": " ", "added": "+", "deleted": "-", "note": "\\ "}


def _file_patch(diff: dict[str, Any]) -> str:
    """R2E's `FileDiff.get_patch`."""
    header = diff["header"]
    patch = f"diff --git a/{header['file']['path']} b/{header['file']['path']}\n"
    if header.get("misc_line"):
        patch += header["misc_line"] + "\n"
    index = diff.get("index_line")
    if index:
        mode = index.get("mode") or ""
        patch += f"index {index['old_commit_hash']}..{index['new_commit_hash']}{' ' if mode else ''}{mode}\n"
    if diff.get("is_binary_file"):
        patch += f"{diff.get('binary_line')}\n"
    if diff.get("minus_file") and diff.get("plus_file"):
        patch += f"--- {diff['minus_file']['path']}\n+++ {diff['plus_file']['path']}\n"
    for hunk in diff.get("hunks") or []:
        d = hunk["descriptor"]
        patch += f"@@ -{_range(d['old_range'])} +{_range(d['new_range'])} @@"
        patch += f" {d['section']}\n" if d.get("section") else "\n"
        for line in hunk["line_group"]["all_lines"]:
            patch += f"{_LINE_PREFIX[line['type']]}{line['content']}\n"
    return patch


def gold_patch(parsed_commit: dict[str, Any]) -> str:
    """R2E's `ParsedCommit.get_patch(test_file=False)`: non-test files, Python only (`only_python=True`)."""
    return "".join(_file_patch(d) for d in parsed_commit["file_diffs"]
                   if d["header"]["file"]["path"].endswith(".py") and not _is_test_file(d["header"]["file"]["path"]))


def _parsed_commit(value: Any) -> tuple[dict[str, Any] | None, str]:
    if not isinstance(value, str):
        return None, f"must be the JSON text of R2E's ParsedCommit, got {type(value).__name__}"
    try:
        commit = json.loads(value)
        diffs = commit["file_diffs"]
        if not isinstance(diffs, list):
            raise TypeError("file_diffs is not a list")
        gold_patch(commit)  # every field the gold patch reads is there and of its type
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON ({exc.msg})"
    except (KeyError, TypeError, AttributeError) as exc:
        return None, f"is not an R2E ParsedCommit (file_diffs[].header.file.path, hunks[]...): {exc!r}"
    return commit, ""


def _expected(value: Any) -> tuple[dict[str, str] | None, str]:
    if not isinstance(value, str):
        return None, f"must be JSON text (R2E-Gym stores it as a string), got {type(value).__name__}"
    try:
        outcomes = json.loads(value)
    except json.JSONDecodeError as exc:
        return None, f"is not valid JSON ({exc.msg})"
    if not isinstance(outcomes, dict) or not outcomes or not all(isinstance(v, str) for v in outcomes.values()):
        return None, "must be a non-empty JSON object of test -> status"
    return outcomes, ""


def _statement(text: str) -> str:
    """R2E's `get_task_instruction`: the text between [ISSUE] and [/ISSUE] when the statement has them."""
    found = re.search(r"\[ISSUE\](.*)\[/ISSUE\]", text, re.DOTALL)
    return found.group(1) if found else text


def parse_r2e_gym(row: Any, row_no: int) -> tuple[Task | None, list[str]]:
    if not isinstance(row, dict):
        return None, [f"row {row_no}: expected an object, got {type(row).__name__}"]
    image, repo, commit_hash = row.get("docker_image"), row.get("repo_name"), row.get("commit_hash")
    label = image if isinstance(image, str) and image else row.get("instance_id")
    where = f"row {row_no}" + (f" ({label})" if isinstance(label, str) and label else "")
    errors: list[str] = []
    if not (isinstance(image, str) and image):
        if isinstance(repo, str) and repo and isinstance(commit_hash, str) and commit_hash:
            image = f"namanjain12/{repo}_final:{commit_hash}"
        else:
            errors.append(f"{where}: field docker_image: missing (and no repo_name + commit_hash to derive it)")
    if not (isinstance(repo, str) and repo):
        errors.append(f"{where}: field repo_name: missing (R2E picks the log parser by it)")
    commit, why = _parsed_commit(row.get("parsed_commit_content"))
    if commit is None:
        errors.append(f"{where}: field parsed_commit_content: {why}")
    expected, why = _expected(row.get("expected_output_json"))
    if expected is None:
        errors.append(f"{where}: field expected_output_json: {why}")
    statement = row.get("problem_statement")
    if not isinstance(statement, str):
        errors.append(f"{where}: field problem_statement: missing")
    if errors or commit is None or expected is None:
        return None, errors
    if repo not in R2E_REPOS:
        return None, [Unsupported(where, f"{_FAMILY} repo {repo}", "R2E's parse_log_fn has no log parser for it")]
    if "swebench" in str(image):
        return None, [Unsupported(where, f"{_FAMILY} SWE-bench images", "R2E grades these with SWE-bench's harness "
                                  "(/run_tests.sh, parsed_commit), which this loader does not reproduce")]
    iid = row.get("instance_id")
    name = str(image).rsplit("/", 1)[-1]
    task = Task(instance_id=iid if isinstance(iid, str) and iid else name, env_name="swe",
                problem_statement=_statement(str(statement)), repo=str(repo), repo_url=f"image://{image}",
                base_commit="HEAD", patch=gold_patch(commit),
                metadata={"image": image, "eval_script": eval_script(), "log_parser": LOG_PARSER,
                          "expected_status": expected, "commit_hash": commit_hash})
    return task, []
