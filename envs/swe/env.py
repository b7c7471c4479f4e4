"""The `swe` environment: extract a patch from the completion, grade it in a sandbox through a scorer callback."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from envs.registry import PromptResult, Scorer, ScoreResult, Task
from envs.swe.patch import extract_patch
from envs.swe.paths import default_task_dir, repos_dir
from envs.swe.payload import payload_to_spec, task_to_payload
from envs.swe.prompt import build_prompt
from envs.swe.retrieval import TOP_K_FUNCTIONS
from fleet.contracts.sandbox import DEFAULT_TASK_TIMEOUT_S, Verdict

if TYPE_CHECKING:
    from fleet.config.env import EnvConfig


class SweEnvironment:
    """Format errors (no usable patch) come back as a verdict with status `format_error` that never reached a
    sandbox, plus `ScoreResult.format_error` = missing | malformed | truncated | no_change (`envs/swe/patch.py`)."""

    name = "swe"

    def __init__(
        self, *, scorer: Scorer | None = None, repos_root: str | Path | None = None,
        task_timeout: float = DEFAULT_TASK_TIMEOUT_S, fail_to_pass_first: bool = False,
    ) -> None:
        self.scorer, self.task_timeout, self.fail_to_pass_first = scorer, task_timeout, fail_to_pass_first
        # Prompts retrieve code context from the task set's bare repos; None means the default task set's.
        self.repos_root = repos_root if repos_root is not None else repos_dir(default_task_dir())

    def task_to_payload(self, task: Task) -> dict[str, Any]:
        return task_to_payload(task)

    def build_prompt(self, task: Task, tokenizer: Any, max_prompt_length: int, context: str = "bm25",
                     context_functions: int = TOP_K_FUNCTIONS) -> PromptResult:
        return build_prompt(task, tokenizer, max_prompt_length, context, repos_root=self.repos_root,
                            functions=context_functions)

    async def score(
        self, payload: dict[str, Any], completion_text: str, *, scorer: Scorer | None = None, sandbox: Any = None,
        cfg: Any = None, truncated: bool = False, **_: Any,
    ) -> ScoreResult:
        """Grade one completion. The scorer is `scorer=`, else the one given at construction, else `sandbox.run`
        (any object with `async run(TaskSpec) -> Verdict`). `truncated=True` (the generation hit its token limit)
        turns a missing patch into a truncated one."""
        extraction = extract_patch(completion_text)
        status = "truncated" if truncated and extraction.status == "missing" else extraction.status
        if status != "ok":
            detail = f"{status}: {extraction.detail}".strip(": ")
            # Never sent to a sandbox: a format error says nothing about the tests.
            verdict = Verdict(status="format_error", error=f"format error ({detail})")
            return ScoreResult(verdict, format_error=status, detail=detail)
        run = scorer or self.scorer or getattr(sandbox, "run", None)
        if run is None:
            raise RuntimeError("the swe environment has no scorer: make_environment('swe', scorer=...) or "
                               "score(..., scorer=...)")
        timeout = cfg.env.code.task_timeout if cfg is not None else self.task_timeout
        first = cfg.env.code.fail_to_pass_first if cfg is not None else self.fail_to_pass_first
        verdict = await run(payload_to_spec(payload, extraction.patch, timeout=timeout, fail_to_pass_first=first))
        if verdict.is_infra_failure:
            return ScoreResult(verdict, infra_error=verdict.error or "sandbox infrastructure failure")
        return ScoreResult(verdict, detail=f"patch from {extraction.source}")


def make_swe_environment(
    env_cfg: EnvConfig | None = None, *, scorer: Scorer | None = None, repos_root: str | Path | None = None
) -> SweEnvironment:
    timeout = env_cfg.code.task_timeout if env_cfg is not None else DEFAULT_TASK_TIMEOUT_S
    first = env_cfg.code.fail_to_pass_first if env_cfg is not None else False
    return SweEnvironment(scorer=scorer, repos_root=repos_root, task_timeout=timeout, fail_to_pass_first=first)
