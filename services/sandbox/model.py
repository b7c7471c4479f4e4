"""The executor's domain types: what a task is and what a verdict says. No HTTP and no I/O here.

Shared by the executor, `sandbox_client` and the task-set builder (which validates bugs through the executor).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# completed: tests ran (see resolution). not_applied: the agent patch did not apply. refused: integrity check.
# timeout: the tests ran past their limit. infra_error: the executor could not do its job (repo missing, disk full,
# sandbox failed to start) -- never a statement about the patch.
TaskStatus = Literal["pending", "running", "completed", "not_applied", "refused", "timeout", "infra_error"]
ResolutionName = Literal["FULL", "PARTIAL", "NO"]


@dataclass(frozen=True)
class TaskSpec:
    """One task: materialise `repo_url`@`base_commit`, apply `patch`, force-apply `test_patch`, run, grade."""

    repo_url: str
    base_commit: str
    patch: str
    test_patch: str = ""
    test_command: str | None = None
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_pass: list[str] = field(default_factory=list)
    reference_patch: str | None = None
    timeout: float = 300.0


@dataclass
class Verdict:
    status: TaskStatus
    patch_applied: bool = False
    test_patch_applied: bool = False
    tests_passed: int = 0
    tests_failed: int = 0
    exit_code: int | None = None
    test_status: dict[str, str] = field(default_factory=dict)
    resolution: ResolutionName = "NO"
    stdout_tail: str = ""
    stderr_tail: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def is_infra_failure(self) -> bool:
        return self.status == "infra_error"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
