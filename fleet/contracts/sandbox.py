"""The sandbox's contract: what a task is and what a verdict says. No HTTP and no I/O here.

Shared by the executor (`services/sandbox`), `sandbox_client`, the environments (`envs`) and the rollout worker, so it
lives on the ground floor, below all of them (it was `services/sandbox/model.py`).
`spec_from_json` / `Verdict.from_json` are the wire format of the seed-compatible HTTP API (`/task/*`).
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

# completed: tests ran (see resolution). not_applied: the agent patch did not apply. refused: integrity check.
# timeout: the tests ran past their limit. infra_error: the executor could not do its job (repo missing, disk full,
# sandbox failed to start) -- never a statement about the patch. format_error: set by the SWE environment when the
# answer held no usable patch; never produced by the executor. integrity_violation: the run's outcome cannot be
# believed (a forged or contradictory report, pytest manipulated from code under test): a statement about the patch.
TaskStatus = Literal[
    "pending", "running", "completed", "not_applied", "refused", "timeout", "infra_error", "format_error",
    "integrity_violation"
]
ResolutionName = Literal["FULL", "PARTIAL", "NO"]
RewardMode = Literal["binary", "pass_rate", "fail_to_pass"]
"""How a completed verdict becomes a reward (`sandbox_client.reward_from_verdict`, `env.code.reward_mode`)."""
TOKEN_ENV = "GRPO_FLEET_SANDBOX_TOKEN"
"""Environment variable holding the bearer token, read by the executor and the client when the config has none."""
FINAL_STATUSES: frozenset[str] = frozenset({"completed", "not_applied", "refused", "timeout", "infra_error",
                                            "integrity_violation"})


DEFAULT_TASK_TIMEOUT_S = 1800.0
"""Seconds a task may run: the SWE-bench harness's own default (`run_evaluation --timeout 1800`); real repositories'
test suites (astropy, sympy, django) take minutes to set up and run, so a shorter default grades slow tests as
`timeout`."""


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
    timeout: float = DEFAULT_TASK_TIMEOUT_S
    integrity_check: bool = True
    """Refuse a patch touching tests or the test runner (`env.code.integrity_check`; the client sends it)."""
    task_paths: list[str] = field(default_factory=list)
    """Files the task's own fix changes (its gold patch's, never shown to the policy): code under test for the
    integrity check even where their names say test helper or runner (pytest's `src/_pytest/`, `django/test/`,
    `sympy/testing/`); without them such a task's gold patch is `refused`, a silent zero."""
    image: str | None = None
    """Environment image of the task (SWE-bench 5 `image`): the task runs inside it, `/testbed` its tree."""
    eval_script: str | None = None
    """SWE-bench 5 `eval_script` (image tasks; None: one of the same shape is made from test_patch and the tests)."""
    log_parser: str | None = None
    """Key of swebench's PARSER_REGISTRY that reads the eval log (image tasks; None: `parse_log_pytest`)."""
    eval_type: str | None = None
    """SWE-bench 5 `eval_type`: `pass_and_fail` (None) or `fail_only`."""
    setup_patch: str | None = None
    """Image tasks: a patch applied to /testbed, and committed as its only commit, before the agent's patch (the
    bug of a SWE-smith task: its image holds the clean repository)."""
    expected_status: dict[str, str] | None = None
    """Image tasks graded by exact match (R2E-Gym's rule): the whole parsed status map, test -> status, the tests must
    give; FULL iff it matches, else NO (fail_to_pass/pass_to_pass then play no part in the resolution)."""
    eval_files: dict[str, str] | None = None
    """Image tasks: files written into /testbed before the eval script runs, path -> base64 bytes (SWE-bench
    Multimodal's test-patch assets, which the harness's script would fetch with curl from a sandbox without network)."""
    fail_to_pass_first: bool = False
    """Run the FAIL_TO_PASS tests alone first and, where every one of them ran and none passed, answer NO without the
    full run (the verdict then lists those tests only). The reward then equals the full run's under `binary` and
    `fail_to_pass` (both pay 0 when no FAIL_TO_PASS test passes), never under `pass_rate`; the resolution too, unless
    a FAIL_TO_PASS test passes only after another test has run. Otherwise the full run grades, in a fresh tree. Tests
    the runner starts itself only (no `test_command`, or one of the task-set form); image tasks and shell commands
    ignore it."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        # Image fields only when set: an executor that predates them (the seed's) rejects unknown keys.
        return {k: v for k, v in data.items() if not (k in IMAGE_KEYS and v is None)
                and not (k in ("task_paths", "fail_to_pass_first") and not v)}


IMAGE_KEYS = ("image", "eval_script", "log_parser", "eval_type", "setup_patch", "expected_status", "eval_files")


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
    report: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """swebench's tests report: {FAIL_TO_PASS|PASS_TO_PASS: {success: [...], failure: [...]}} (empty: no lists)."""
    stdout_bytes: int = 0
    """Bytes the tests wrote to stdout (only the tail is kept)."""
    stderr_bytes: int = 0
    """Bytes the tests wrote to stderr (only the tail is kept)."""
    gradable: bool = True
    """False when the tests ran but their log could not be graded (no markers, an error marker, an exit code that
    contradicts the log): resolution NO then says nothing about the patch, and its reward is a silent zero."""

    @property
    def is_infra_failure(self) -> bool:
        return self.status == "infra_error"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Verdict:
        """Inverse of `to_json`; keys this version does not know (a newer executor's) are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class SpecError(ValueError):
    """A task request that cannot be run; `field` names the offending key (the HTTP layer answers 400)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


_SPEC_KEYS = {"repo_url", "base_commit", "patch", "test_patch", "test_command", "fail_to_pass", "pass_to_pass",
              "reference_patch", "timeout", "integrity_check", "image", "eval_script", "log_parser", "eval_type",
              "setup_patch", "expected_status", "task_paths", "eval_files", "fail_to_pass_first"}
# Labels seed clients send along; accepted and ignored so that a misspelt key is still an error.
_IGNORED_KEYS = {"instance_id", "metadata"}


def _string(data: dict[str, Any], key: str, *, required: bool = False, default: str | None = "") -> str | None:
    if key not in data or data[key] is None:
        if required:
            raise SpecError(key, "is required")
        return default
    value = data[key]
    if not isinstance(value, str):
        raise SpecError(key, f"must be a string, got {type(value).__name__}")
    return value


def _test_ids(data: dict[str, Any], key: str) -> list[str]:
    value = data.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        # SWE-bench datasets store these lists as JSON text.
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SpecError(key, "must be a list of test ids (or its JSON text)") from exc
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise SpecError(key, "must be a list of non-empty test id strings")
    return value


def _flag(data: dict[str, Any], key: str, default: bool) -> bool:
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(key, f"must be true or false, got {value!r}")
    return value


def _timeout(data: dict[str, Any], max_timeout: float) -> float:
    value = data.get("timeout", DEFAULT_TASK_TIMEOUT_S)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError("timeout", "must be a number of seconds")
    if not 0 < value <= max_timeout:
        raise SpecError("timeout", f"must be in (0, {max_timeout:g}] seconds (sandbox.max_timeout_s), got {value}")
    return float(value)


_EVAL_TYPES = ("pass_and_fail", "fail_only")


def _expected_status(data: dict[str, Any]) -> dict[str, str] | None:
    value = data.get("expected_status")
    if value is None:
        return None
    # Keys as R2E's parser makes them: an empty name is one (a summary line without `::`), so only types are checked.
    if not isinstance(value, dict) or not value or not all(isinstance(k, str) and isinstance(v, str)
                                                           for k, v in value.items()):
        raise SpecError("expected_status", "must be a non-empty object of test name -> status string")
    return dict(value)


def _eval_files(data: dict[str, Any]) -> dict[str, str] | None:
    value = data.get("eval_files")
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
            isinstance(p, str) and p and not p.startswith("/") and ".." not in p.split("/") and isinstance(v, str)
            for p, v in value.items()):
        raise SpecError("eval_files", "must be an object of relative path -> base64 content")
    try:
        for v in value.values():
            base64.b64decode(v, validate=True)
    except ValueError:
        raise SpecError("eval_files", "values must be base64") from None
    return dict(value)


def _task_paths(data: dict[str, Any]) -> list[str]:
    value = data.get("task_paths") or []
    if not isinstance(value, list) or not all(isinstance(p, str) and p and not p.startswith("/")
                                              and ".." not in p.split("/") for p in value):
        raise SpecError("task_paths", "must be a list of paths relative to the repository root")
    return list(value)


def _image_fields(data: dict[str, Any]) -> dict[str, Any]:
    image = _string(data, "image", default=None) or None
    if image is not None and (any(c.isspace() for c in image) or image.startswith("-")):
        raise SpecError("image", f"must be an image reference like repo/name:tag, got {image!r}")
    fields_ = {"image": image, "eval_script": _string(data, "eval_script", default=None) or None,
               "log_parser": _string(data, "log_parser", default=None) or None,
               "eval_type": _string(data, "eval_type", default=None) or None,
               "setup_patch": _string(data, "setup_patch", default=None) or None,
               "expected_status": _expected_status(data), "eval_files": _eval_files(data)}
    if image is None:
        given = [k for k in IMAGE_KEYS[1:] if fields_[k] is not None]
        if given:
            raise SpecError(given[0], "only applies to a task with an image (send `image` too)")
    if fields_["eval_type"] is not None and fields_["eval_type"] not in _EVAL_TYPES:
        raise SpecError("eval_type", f"must be one of {', '.join(_EVAL_TYPES)}, got {fields_['eval_type']!r}")
    return fields_


def spec_from_json(data: Any, *, max_timeout: float = 3600.0) -> TaskSpec:
    """Validate a `POST /task/submit` body (or any dict) into a TaskSpec; `SpecError` names the bad field."""
    if not isinstance(data, dict):
        raise SpecError("body", f"must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _SPEC_KEYS - _IGNORED_KEYS)
    if unknown:
        raise SpecError(unknown[0], f"unknown field (known: {', '.join(sorted(_SPEC_KEYS))})")
    repo_url = _string(data, "repo_url", required=True) or ""
    if not repo_url.strip():
        raise SpecError("repo_url", "must not be empty")
    base_commit = _string(data, "base_commit", required=True) or ""
    if not base_commit or base_commit.startswith("-") or any(c.isspace() or ord(c) < 32 for c in base_commit):
        raise SpecError("base_commit", "must be a commit id or ref (no whitespace, not starting with '-')")
    if "patch" not in data:
        raise SpecError("patch", 'is required (send "" for no change)')
    spec = TaskSpec(
        repo_url=repo_url,
        base_commit=base_commit,
        patch=_string(data, "patch") or "",
        test_patch=_string(data, "test_patch") or "",
        test_command=_string(data, "test_command", default=None) or None,
        fail_to_pass=_test_ids(data, "fail_to_pass"),
        pass_to_pass=_test_ids(data, "pass_to_pass"),
        reference_patch=_string(data, "reference_patch", default=None),
        timeout=_timeout(data, max_timeout),
        integrity_check=_flag(data, "integrity_check", True),
        fail_to_pass_first=_flag(data, "fail_to_pass_first", False),
        task_paths=_task_paths(data),
        **_image_fields(data),
    )
    check_spec(spec)
    return spec


def check_spec(spec: TaskSpec) -> None:
    """Rules every spec obeys, whether it came over HTTP or from in-process callers."""
    if spec.test_command is None and spec.eval_script is None and not spec.fail_to_pass and not spec.pass_to_pass:
        raise SpecError("test_command", "either test_command or fail_to_pass/pass_to_pass must be given")
    if not spec.timeout > 0:
        raise SpecError("timeout", f"must be positive, got {spec.timeout}")
    for key in ("fail_to_pass", "pass_to_pass"):
        for test_id in getattr(spec, key):
            path = test_id.split("::", 1)[0]
            # The default command passes these paths to pytest: an option or a path outside the tree is never a test.
            if path.startswith("-") or path.startswith("/") or ".." in path.split("/"):
                raise SpecError(key, f"test id {test_id!r} must start with a path relative to the repository root")


def describe_runner(versions: dict[str, str]) -> str:
    """`Python 3.11.7, pytest 9.2.0`."""
    names = sorted(versions, key=lambda k: (k != "python", k))
    return ", ".join(f"{'Python' if k == 'python' else k} {versions[k]}" for k in names) or "unknown"


def runner_mismatch(made_with: dict[str, str], runs_with: dict[str, str]) -> str | None:
    """Why test ids recorded under `made_with` may not be the ids of a run under `runs_with`, or None. pytest's
    release (major.minor) is what names the tests; Python's minor version too (a test module may parametrise on
    it). Either side unknown is no finding: a task set made before the versions were recorded."""
    def release(versions: dict[str, str], name: str) -> list[str] | None:
        version = versions.get(name)
        return version.split(".")[:2] if version else None

    pairs = [(release(made_with, k), release(runs_with, k)) for k in ("pytest", "python")]
    if not any(made and runs and made != runs for made, runs in pairs):
        return None
    return (f"the task set's test ids were made with {describe_runner(made_with)}, and this executor runs "
            f"{describe_runner(runs_with)}: a test may carry another id (pytest's parametrised names change between "
            f"releases) and a gold patch then grades NO. Run the executor on the versions the set was built with "
            f"(sandbox.python), or rebuild the set with the executor's")
