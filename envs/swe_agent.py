"""The `swe` environment in agent mode (`env.code.mode: agent`): the same tasks and payload, but the prompt is an
episode's opening -- the system prompt, the problem statement, and the tool descriptions given to the tokenizer's
chat template (`tools=`) -- instead of the single-shot "answer with a diff" prompt. The rollout worker runs the
episode against a sandbox session and grades the session's diff (`rollout/agent`); `score` is the single-shot one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from envs.registry import PromptResult, Task
from envs.swe.assets import statement_with_image_notes
from envs.swe.env import SweEnvironment, make_swe_environment

if TYPE_CHECKING:
    from fleet.config.env import EnvConfig

_TRUNC_MARK = "\n[... the rest of the statement is cut ...]"


def user_message(task: Task, statement: str) -> str:
    where = f" of {task.repo}" if task.repo else ""
    return (f"The repository{where} is checked out in your working folder. Fix this issue:\n\n{statement}\n\n"
            "The hidden tests of the fix will be run on your changes after you call submit.")


class SweAgentEnvironment(SweEnvironment):
    def __init__(self, *, system_prompt: str, **kw: Any) -> None:
        super().__init__(**kw)
        self.system_prompt = system_prompt

    def build_prompt(self, task: Task, tokenizer: Any, max_prompt_length: int, context: str = "none",
                     context_functions: int = 0) -> PromptResult:
        """Code context is never inlined: the agent reads the files it wants. A statement too long for
        `max_prompt_length` is cut (with a marker)."""
        from envs.agent.chat import ChatFormat
        from envs.agent.tools import TOOL_SPECS

        fmt = ChatFormat(tokenizer)
        statement = statement_with_image_notes(task)
        ids = fmt.prompt_ids(self.system_prompt, user_message(task, statement), TOOL_SPECS)
        lo, hi, best = 0, len(statement), None
        while len(ids) > max_prompt_length and lo <= hi:  # longest statement prefix that fits
            mid = (lo + hi) // 2
            trial = fmt.prompt_ids(self.system_prompt, user_message(task, statement[:mid] + _TRUNC_MARK), TOOL_SPECS)
            if len(trial) <= max_prompt_length:
                best, lo = trial, mid + 1
            else:
                hi = mid - 1
        if len(ids) > max_prompt_length:
            if best is None:
                raise ValueError(f"max_prompt_length={max_prompt_length} cannot hold the agent prompt of task "
                                 f"{task.instance_id} (tool descriptions included); raise data.*.max_prompt_length")
            ids = best
        return PromptResult(ids, fmt.decode(ids), statement_truncated=ids is best)


def make_swe_environment_for_mode(env_cfg: EnvConfig | None = None, **deps: Any) -> SweEnvironment:
    """`swe`: the single-shot environment, or the agent-mode one when `env.code.mode` is `agent`."""
    if env_cfg is None or env_cfg.code.mode != "agent":
        return make_swe_environment(env_cfg, **deps)
    return SweAgentEnvironment(system_prompt=env_cfg.code.agent.system_prompt, scorer=deps.get("scorer"),
                               repos_root=deps.get("repos_root"), task_timeout=env_cfg.code.task_timeout)
