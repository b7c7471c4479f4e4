"""The eval script of SWE-bench 5's shape, for rows that carry none: a contract between the task-set builder (which
bakes it into an embedded task's image) and the sandbox's image grading (which runs it for SWE-Gym, SWE-smith,
R2E-Gym and older SWE-bench rows). The markers are swebench's, so swebench's log parsers read the result."""

from __future__ import annotations

import shlex

from fleet.contracts.sandbox import TaskSpec

WORKDIR = "/testbed"
"""Where an instance image holds the task's repository (SWE-bench's layout)."""
GIT = "git -c safe.directory=* -c core.hooksPath=/dev/null -c core.fsmonitor=false"
"""git as the eval steps call it: no repository-owned hooks or fsmonitor run, whoever owns the tree."""
HEREDOC = "EOF_114329324912"


def test_files(spec: TaskSpec) -> list[str]:
    return sorted({t.split("::", 1)[0] for t in [*spec.fail_to_pass, *spec.pass_to_pass]})


def derived_eval_script(spec: TaskSpec, test_paths: list[str]) -> str:
    """An eval script of SWE-bench 5's shape for rows that carry none (SWE-Gym, SWE-smith, R2E-Gym, older rows)."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT

    base = shlex.quote("HEAD" if spec.setup_patch else spec.base_commit)
    files = " ".join(shlex.quote(p) for p in test_paths)
    # `python3 -m`: the tree on sys.path even where the repository is not installed (and every image has python3).
    command = spec.test_command or "python3 -m pytest -rA " + " ".join(shlex.quote(p) for p in test_files(spec))
    lines = ["#!/bin/bash", "set -uxo pipefail",
             "if [ -f /opt/miniconda3/bin/activate ]; then source /opt/miniconda3/bin/activate; "
             "conda activate testbed; fi", f"cd {WORKDIR}"]
    if test_paths:
        lines.append(f"{GIT} checkout {base} -- {files} 2>/dev/null || true")
    if spec.test_patch.strip():
        body = spec.test_patch if spec.test_patch.endswith("\n") else spec.test_patch + "\n"
        lines.append(f"{GIT} apply --verbose - <<'{HEREDOC}'\n{body}{HEREDOC}")
    lines += [f": '{START_TEST_OUTPUT}'", command, f": '{END_TEST_OUTPUT}'"]
    if test_paths:
        lines.append(f"{GIT} checkout {base} -- {files} 2>/dev/null || true")
    return "\n".join(lines) + "\n"
