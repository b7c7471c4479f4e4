"""R2E-Gym rows: `docker_image` (or `namanjain12/<repo_name>_final:<commit_hash>`) holds the repository in
`/testbed` and the hidden tests in `/r2e_tests`; `expected_output_json` lists the outcome of each test on the fixed
tree.
"""

from __future__ import annotations

import json
from typing import Any

from envs.registry import Task


def _where(row: dict[str, Any], row_no: int, key: str = "instance_id") -> str:
    iid = row.get(key)
    return f"row {row_no}" + (f" ({iid})" if isinstance(iid, str) and iid else "")


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
