"""`lookup`: a multi-turn tool environment a tiny model learns in minutes, where the answer can only come from a tool.

A task is a table of `env.lookup.table_size` keys (`k0`..`k{num_keys-1}`) with values drawn at random per task
(10..`max_value`) and a question naming one key: "What is the value of k7?". The value is in no prompt and no
weights (it is new for every task): only the `lookup` tool returns it, and only for the right key (another key of
the table gives another value, a key not in it an error). The episode ends with the `answer` tool.

    <tool_call>
    {"name": "lookup", "arguments": {"key": "k7"}}
    </tool_call>                                     -> observation "57"
    <tool_call>
    {"name": "answer", "arguments": {"value": "57"}}
    </tool_call>                                     -> ends the episode; graded: right iff the value is 57

Episodes run in the agent loop of agent mode (`rollout/agent`: same parser, chat format, observation masks,
trajectory contract, budgets from `env.code.agent`), but the tools run in the rollout worker's process
(`LookupTools`): they read a dict from the task's payload and touch nothing else, so a sandbox would isolate
nothing; a session round-trip would only cost time. Verdicts are the sandbox's `Verdict` type (tests `format`,
`lookup` and `answer`, as `arith` has tests), so the reward path is the one of every environment.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from envs.registry import PromptResult, ScoreResult, Task, TaskDataset
from fleet.contracts.sandbox import Verdict

if TYPE_CHECKING:
    from envs.agent.parser import ToolCall
    from envs.agent.tools import Observation
    from fleet.config.env import DatasetConfig, EnvConfig, LookupEnvConfig

SYSTEM_PROMPT = "Use the tools. Answer with the value."
LOOKUP_TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "lookup", "description": "The value stored under a key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
    {"type": "function", "function": {
        "name": "answer", "description": "Give the answer; ends the episode.",
        "parameters": {"type": "object", "properties": {"value": {"type": "string"}}, "required": ["value"]}}},
]
# The tools block for a template that ignores `tools=` (the tiny model's): a few tokens instead of the Hermes
# block's ~300, so that a learning run on CPU trains on the episode, not on boilerplate.
COMPACT_TOOLS = ("\nTools: lookup(key) gives the value of a key; answer(value) ends. Call one as "
                 '<tool_call>{{"name": ..., "arguments": {{...}}}}</tool_call>.')


def question(key: str) -> str:
    return f"What is the value of {key}?"


def make_lookup_tasks(seed: int, split: str, num_tasks: int, cfg: LookupEnvConfig) -> list[Task]:
    """Deterministic from (seed, split): the same arguments always give the same tables, keys and ids."""
    if cfg.table_size > cfg.num_keys:
        raise ValueError(f"env.lookup.table_size={cfg.table_size} exceeds env.lookup.num_keys={cfg.num_keys}")
    rng = random.Random(f"lookup:{seed}:{split}")
    low = 10 if cfg.max_value >= 10 else 0  # two-digit values: a guess is right 1 time in 90
    keys = [f"k{i}" for i in range(cfg.num_keys)]
    tasks = []
    for i in range(num_tasks):
        chosen = rng.sample(keys, cfg.table_size)
        values = rng.sample(range(low, cfg.max_value + 1), min(cfg.table_size, cfg.max_value + 1 - low))
        table = {k: values[j % len(values)] for j, k in enumerate(chosen)}
        key = rng.choice(chosen)
        tasks.append(Task(instance_id=f"lookup-{seed}-{split}-{i:06d}", env_name="lookup",
                          problem_statement=question(key), split=split,
                          metadata={"key": key, "table": table, "answer": table[key]}))
    return tasks


def load_lookup_dataset(cfg: DatasetConfig, *, env_cfg: EnvConfig | None = None, seed: int = 0,
                        **_: Any) -> TaskDataset:
    """`data.*.dataset_name=lookup`: `env.lookup.num_tasks` training tasks (a tenth of that for validation)."""
    from fleet.config.env import LookupEnvConfig

    lookup = env_cfg.lookup if env_cfg is not None else LookupEnvConfig()
    split = "validation" if cfg.split == "test" else cfg.split
    n = lookup.num_tasks if split == "train" else max(1, min(200, lookup.num_tasks // 10))
    if cfg.max_samples is not None:
        n = min(n, cfg.max_samples)
    return TaskDataset("lookup", "lookup", make_lookup_tasks(seed, split, n, lookup))


class LookupTools:
    """The episode's tools, run in-process over the task's table (the agent loop's `ToolRunner`)."""

    def __init__(self, table: dict[str, int]) -> None:
        self.table = table
        self.lookups: list[str] = []
        self.answer: str | None = None

    async def run(self, call: ToolCall) -> Observation:
        from envs.agent.tools import Observation

        args = call.arguments
        if call.name == "answer":
            value = args.get("value")
            if not isinstance(value, str | int) or isinstance(value, bool):
                return Observation("error: answer: argument 'value' must be a string", error=True)
            self.answer = str(value).strip()
            return Observation("answered", submitted=True)
        if call.name != "lookup":
            return Observation(f"error: unknown tool {call.name!r}; the tools are answer, lookup", error=True)
        key = args.get("key")
        if not isinstance(key, str):
            return Observation("error: lookup: argument 'key' must be a string", error=True)
        self.lookups.append(key)
        if key not in self.table:
            return Observation(f"error: no key {key!r}", error=True)
        return Observation(str(self.table[key]))


def score_episode(expected: int, answer: str | None, looked_up: bool = False) -> ScoreResult:
    """Always a `completed` verdict with three tests: `format` (the episode called `answer`), `lookup` (it looked up
    the question's key) and `answer` (with the right value). FULL iff the value is right (binary reward); the other
    two are the partial credit of `pass_rate`, the shaping a tiny model's first steps need (as in `arith`). An
    episode that never answered is a format error (`format_error_reward`)."""
    right = answer is not None and answer == str(expected)
    tests = {"format": answer is not None, "lookup": looked_up, "answer": right}
    passed = sum(tests.values())
    verdict = Verdict(status="completed", patch_applied=answer is not None, tests_passed=passed,
                      tests_failed=len(tests) - passed, exit_code=0 if right else 1,
                      test_status={k: "PASSED" if v else "FAILED" for k, v in tests.items()},
                      resolution="FULL" if right else "NO",
                      error="" if answer is not None else "format error (missing): the episode never called answer")
    detail = "format error: missing" if answer is None else f"expected {expected}, got {answer!r}"
    return ScoreResult(verdict, format_error=None if answer is not None else "missing", detail=detail)


class LookupEnvironment:
    name = "lookup"
    tools_in_process = True
    """Episodes of this environment run in the rollout worker's agent loop with `episode_tools` (no sandbox)."""

    def task_to_payload(self, task: Task) -> dict[str, Any]:
        return {"instance_id": task.instance_id, "table": dict(task.metadata["table"]), "key": task.metadata["key"],
                "answer": int(task.metadata["answer"])}

    def build_prompt(self, task: Task, tokenizer: Any, max_prompt_length: int, context: str = "none",
                     context_functions: int = 0) -> PromptResult:
        from envs.agent.chat import tool_prompt

        return PromptResult(*tool_prompt(tokenizer, "lookup", SYSTEM_PROMPT, task.problem_statement, LOOKUP_TOOL_SPECS,
                                         max_prompt_length=max_prompt_length, fallback=COMPACT_TOOLS))

    def episode_tools(self, payload: dict[str, Any]) -> LookupTools:
        return LookupTools({str(k): int(v) for k, v in payload["table"].items()})

    def score_tools(self, payload: dict[str, Any], tools: LookupTools) -> ScoreResult:
        return score_episode(int(payload["answer"]), tools.answer, payload.get("key") in tools.lookups)

    async def score(self, payload: dict[str, Any], completion_text: str, **_: Any) -> ScoreResult:
        """A single-shot completion (no episode): its last `answer` call, if any, is the answer -- the value cannot
        be known without a lookup, so this scores a guess."""
        from envs.agent.parser import ToolCallError, parse_tool_calls

        try:
            calls = parse_tool_calls(completion_text)
        except ToolCallError:
            calls = []
        answers = [c.arguments.get("value") for c in calls if c.name == "answer"]
        return score_episode(int(payload["answer"]), str(answers[-1]).strip() if answers else None)


def make_lookup_environment(env_cfg: EnvConfig | None = None, **_: Any) -> LookupEnvironment:
    return LookupEnvironment()
