"""The JSON payload of a SWE prompt group (`PromptGroup.env_payload`) and the sandbox TaskSpec made from it.

The payload holds what scoring needs and nothing the policy should not see: no gold patch, no statement.
"""

from __future__ import annotations

import re
from typing import Any

from envs.registry import Task
from fleet.contracts.sandbox import TaskSpec

PAYLOAD_KEYS = ("instance_id", "repo_url", "base_commit", "test_patch", "fail_to_pass", "pass_to_pass",
                "test_command")
IMAGE_KEYS = ("image", "eval_script", "log_parser", "eval_type", "setup_patch", "expected_status", "eval_files")
"""Optional: a task that names its environment image (SWE-bench 5 rows, or the name its loader derived)."""


_DIFF_PATHS = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)


def fix_paths(patch: str) -> list[str]:
    """The files a (gold) patch changes: what the sandbox grades as code under test whatever their names (a pytest
    task's `src/_pytest/`, a django task's `django/test/`). In the payload only, never in a prompt."""
    return sorted({p for pair in _DIFF_PATHS.findall(patch) for p in pair})


def task_to_payload(task: Task) -> dict[str, Any]:
    return {
        "instance_id": task.instance_id,
        "repo_url": task.repo_url,
        "base_commit": task.base_commit,
        "test_patch": task.test_patch,
        "fail_to_pass": list(task.fail_to_pass),
        "pass_to_pass": list(task.pass_to_pass),
        "test_command": task.test_command,
        **{k: task.metadata[k] for k in IMAGE_KEYS if task.metadata.get(k)},
        **({"task_paths": paths} if (paths := fix_paths(task.patch)) else {}),
    }


def payload_to_spec(payload: dict[str, Any], patch: str, *, timeout: float = 1800.0,
                    fail_to_pass_first: bool = False) -> TaskSpec:
    """The sandbox task that grades `patch` against the payload's task (`fail_to_pass_first`:
    `env.code.fail_to_pass_first`)."""
    missing = [k for k in PAYLOAD_KEYS if k not in payload]
    if missing:
        raise ValueError(f"SWE payload lacks {', '.join(missing)} (instance {payload.get('instance_id', '?')})")
    return TaskSpec(
        repo_url=payload["repo_url"],
        base_commit=payload["base_commit"],
        patch=patch,
        test_patch=payload["test_patch"] or "",
        test_command=payload["test_command"],
        fail_to_pass=list(payload["fail_to_pass"]),
        pass_to_pass=list(payload["pass_to_pass"]),
        timeout=timeout,
        image=payload.get("image") or None,
        eval_script=payload.get("eval_script") or None,
        log_parser=payload.get("log_parser") or None,
        eval_type=payload.get("eval_type") or None,
        setup_patch=payload.get("setup_patch") or None,
        expected_status=dict(payload["expected_status"]) if payload.get("expected_status") else None,
        task_paths=list(payload.get("task_paths") or []),
        eval_files=dict(payload["eval_files"]) if payload.get("eval_files") else None,
        fail_to_pass_first=fail_to_pass_first,
    )
