"""The `computer_use` environment and dataset, registered like `arith` (`envs/registry.py`).

Wiring: the trainer loads `computer_use` tasks (generated from `grpo.seed`, `env.computer_use`), builds each prompt
with `build_prompt` -- text only: the system prompt with the action tools given to the chat template (`tools=`),
then the task's instruction -- and ships `task_to_payload(task)` to the rollout worker. The worker's episode runner
opens a sandbox computer session with that payload (the page, its viewport and its check), whose first screenshot
is the first observation, and `finish` grades the final page. `score` exists for the registry's protocol only: a
computer-use answer is an episode, never one completion.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from envs.computer_use.actions import COMPUTER_TOOLS
from envs.computer_use.tasks import make_tasks
from envs.registry import PromptResult, ScoreResult, Task, TaskDataset

if TYPE_CHECKING:
    from fleet.config.env import ComputerUseEnvConfig, DatasetConfig, EnvConfig

# For a chat template that ignores `tools=`: the Hermes / Qwen 2.5 block, as the agent loop's chat format adds it.
_TOOLS_BLOCK = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


def _section(env_cfg: EnvConfig | None) -> ComputerUseEnvConfig:
    from fleet.config.env import ComputerUseEnvConfig

    return env_cfg.computer_use if env_cfg is not None else ComputerUseEnvConfig()


def make_computer_tasks(cfg: ComputerUseEnvConfig, seed: int, split: str, n: int) -> list[Task]:
    """`n` tasks of `split` (train | validation), deterministic from (seed, split, cfg)."""
    viewport = (cfg.viewport[0], cfg.viewport[1])
    out = []
    for i, page in enumerate(make_tasks(seed, split, n, tuple(cfg.families), viewport)):
        out.append(Task(instance_id=f"cu-{seed}-{split}-{i:06d}", env_name="computer_use",
                        problem_statement=page.instruction, split=split,
                        metadata={"family": page.family, "params": json.loads(page.key)[1], "html": page.html,
                                  "check": page.check, "viewport": list(viewport)}))
    return out


def load_computer_use_dataset(cfg: DatasetConfig, *, env_cfg: EnvConfig | None = None, seed: int = 0,
                              **_: Any) -> TaskDataset:
    """`data.*.dataset_name=computer_use`: `env.computer_use.num_tasks` training tasks, or
    `num_validation_tasks` of the validation split (`test` reads as validation)."""
    section = _section(env_cfg)
    split = "validation" if cfg.split == "test" else cfg.split
    n = section.num_tasks if split == "train" else section.num_validation_tasks
    if cfg.max_samples is not None:
        n = min(n, cfg.max_samples)
    return TaskDataset("computer_use", "computer_use", make_computer_tasks(section, seed, split, n))


def user_message(task: Task) -> str:
    return f"{task.problem_statement} The first screenshot of the page follows."


class ComputerUseEnvironment:
    name = "computer_use"

    def __init__(self, cfg: ComputerUseEnvConfig) -> None:
        self.cfg = cfg

    def task_to_payload(self, task: Task) -> dict[str, Any]:
        """What the sandbox needs to run the task (`POST /computer/sessions`'s `task`): the page, its viewport, the
        check, and the episode's action budget."""
        meta = task.metadata
        return {"instance_id": task.instance_id, "family": meta["family"], "instruction": task.problem_statement,
                "html": meta["html"], "viewport": list(meta["viewport"]), "check": meta["check"],
                "action_timeout_s": self.cfg.action_timeout_s, "max_actions": self.cfg.max_actions}

    def build_prompt(self, task: Task, tokenizer: Any, max_prompt_length: int, context: str = "none",
                     context_functions: int = 0) -> PromptResult:
        """Text only: the system prompt, the tools (through the chat template) and the instruction; the runner
        appends the first screenshot as the first observation. `tokenizer` may be a processor (its tokenizer is
        used)."""
        tok = getattr(tokenizer, "tokenizer", tokenizer)
        if not getattr(tok, "chat_template", None):
            raise ValueError("computer_use needs a tokenizer with a chat template (tokenizer.chat_template is empty)")
        messages = [{"role": "system", "content": self.cfg.system_prompt},
                    {"role": "user", "content": user_message(task)}]
        text = str(tok.apply_chat_template(messages, tools=COMPUTER_TOOLS, add_generation_prompt=True, tokenize=False))
        if text == str(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)):
            block = _TOOLS_BLOCK.format(tools="\n".join(json.dumps(t) for t in COMPUTER_TOOLS))
            messages[0] = {"role": "system", "content": self.cfg.system_prompt + block}
            text = str(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        if len(ids) > max_prompt_length:
            raise ValueError(f"the computer_use prompt of {len(ids)} tokens (tool descriptions included) exceeds "
                             f"data.*.max_prompt_length={max_prompt_length}")
        return PromptResult(ids, text)

    async def score(self, payload: dict[str, Any], completion_text: str, **_: Any) -> ScoreResult:
        raise NotImplementedError("computer_use is scored by its episode (rollout/agent/computer.py over a sandbox "
                                  "computer session), never from one completion")


def make_computer_use_environment(env_cfg: EnvConfig | None = None, **_: Any) -> ComputerUseEnvironment:
    return ComputerUseEnvironment(_section(env_cfg))
