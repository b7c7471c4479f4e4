"""`peek`: a two-turn tool environment whose answer only a tool call can give, small enough for a tiny model to
learn on CPU in minutes (issue 17).

A task is a hidden digit, drawn at random per task, and always the same question: "What is the digit?".
The digit is in no prompt and no weights; the `read` tool (no arguments) returns it. The episode's last turn is
the answer as plain text, the Qwen / Hermes convention: a reply without a tool call is the final answer.

    <tool_call>{"name": "read"}</tool_call>          -> observation "7"
    7                                                -> ends the episode; right iff it is 7

Chance level is 1/10 (`CHANCE`): digits are uniform, so an answer that ignores the tool's result is right one time
in ten whatever it is. Why this shape (docs/performance.md, "Agent mode"): the tiny model (3.7M parameters) did not
learn to copy `lookup`'s value (~41-token JSON calls twice per episode, ~190 tokens, a key `k0` whose digit competes
with the value); here the episode is ~12 generated tokens with `<tool_call>` / `</tool_call>` as single tokens
(as in real Qwen tokenizers: `TOOL_TOKENS`, added to the base model's tokenizer), the prompt holds no digit, and
the answer is one token: the copy is the whole skill.

Scoring is strict (issue 21's lesson: a token the reward does not see drifts): the answer must follow a successful
`read` and be exactly one digit ended by the end of turn. An answer without a read (a guess, or after a malformed
call), other text, a number of several digits, no end of turn (the turn budget ran out), or no answer at all is a
format error, reward `env.code.format_error_reward`. Without the read requirement a guess scored like a read at
chance, nothing in the reward held the call, and in the first fleet run one AdamW step took the tool call from 89% of
sampled episodes to 0% within 3 steps (docs/performance.md, "Agent mode").
Episodes run in the agent loop (`rollout/agent`: parser, chat format, token-exact trajectories, observation masks,
budgets from `env.code.agent`) with the tools in the worker's process (`PeekTools`, `rollout/agent/local.py`).
Verdicts have three tests, `format`, `read` (the tool was called) and `answer`; FULL iff the answer is right.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from envs.registry import PromptResult, ScoreResult, Task, TaskDataset
from fleet.contracts.sandbox import Verdict

if TYPE_CHECKING:
    from envs.agent.parser import ToolCall
    from envs.agent.tools import Observation
    from fleet.config.env import DatasetConfig, EnvConfig

CHANCE = 0.1
NUM_TRAIN_TASKS = 20000
NUM_VALIDATION_TASKS = 200
QUESTION = "What is the digit?"
SYSTEM_PROMPT = "Answer with the digit"  # + " read() gives." or the template's tools block
TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "read", "description": "Gives the hidden digit.",
        "parameters": {"type": "object", "properties": {}}}},
]
# For a template that ignores `tools=` (the tiny model's): 4 tokens instead of the Hermes block's ~300; every prompt
# token is in every training sequence (~32 tokens of an episode's ~58).
COMPACT_TOOLS = " read() gives."
TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
"""Single tokens in Qwen 2.5 / 3 tokenizers; `workshop.pretrain.ensure_format_model(extra_tokens=)` adds them to the
tiny model's tokenizer for this environment's base (the shared `tiny-qwen2` stays as it is)."""
CALL = '<tool_call>{"name": "read"}</tool_call>'
_ONE_DIGIT = re.compile(r"\d")


def make_peek_tasks(seed: int, split: str, num_tasks: int) -> list[Task]:
    """Deterministic from (seed, split); digits uniform over 0-9."""
    rng = random.Random(f"peek:{seed}:{split}")
    return [Task(instance_id=f"peek-{seed}-{split}-{i:06d}", env_name="peek", problem_statement=QUESTION,
                 split=split, metadata={"answer": rng.randrange(10)}) for i in range(num_tasks)]


def load_peek_dataset(cfg: DatasetConfig, *, seed: int = 0, **_: Any) -> TaskDataset:
    """`data.*.dataset_name=peek`: 20000 training tasks, 200 validation ones (`test` reads those). Every task has
    the same prompt, so held-out tasks differ from training ones by their digit only: validation measures whether
    the answer follows the tool's result."""
    split = "validation" if cfg.split == "test" else cfg.split
    n = NUM_VALIDATION_TASKS if split == "validation" else NUM_TRAIN_TASKS
    if cfg.max_samples is not None:
        n = min(n, cfg.max_samples)
    return TaskDataset("peek", "peek", make_peek_tasks(seed, split, n))


def format_corpus(seed: int, direct_frac: float = 0.0, echo_frac: float = 0.0,
                  copy_frac: float = 0.0) -> Iterator[list[dict[str, str]]]:
    """Episodes in the format with a **random** answer, independent of the observation (`workshop/pretrain.py` trains
    the base on them: it learns the call and the answer's shape, nothing about which digit is right).
    `direct_frac`: the share that answers at once, without the tool. `echo_frac`: the share replaced by a chat
    with no tool in which the user names a digit and the answer repeats it ("Repeat the digit 7." -> "7"): a
    copy from the context, as any pretrained model can, but never from a tool's result. `copy_frac`: the share of
    the episodes that read whose answer *is* the tool's result (the tool-use base: it copies when it reads, and
    with a high `direct_frac` it seldom reads; GRPO then has to teach the call, not the copy)."""
    rng = random.Random(f"peek:format:{seed}")
    system = SYSTEM_PROMPT + COMPACT_TOOLS.format()  # what ChatFormat.prompt_ids writes for the tiny template
    while True:
        if echo_frac and rng.random() < echo_frac:
            digit = str(rng.randrange(10))
            yield [{"role": "system", "content": system}, {"role": "user", "content": f"Repeat the digit {digit}."},
                   {"role": "assistant", "content": digit}]
            continue
        chat = [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]
        seen = None
        if rng.random() >= direct_frac:
            seen = str(rng.randrange(10))
            chat += [{"role": "assistant", "content": CALL}, {"role": "tool", "content": seen}]
        answer = str(rng.randrange(10))  # drawn in this order so that copy_frac=0 keeps the recorded corpus
        if seen is not None and copy_frac and rng.random() < copy_frac:
            answer = seen
        yield [*chat, {"role": "assistant", "content": answer}]


class PeekTools:
    """The episode's tool over its digit (the agent loop's `ToolRunner`), and its final text answer."""

    def __init__(self, digit: int) -> None:
        self.digit = digit
        self.peeks = 0
        self.answer: str | None = None
        self.answer_closed = False

    async def run(self, call: ToolCall) -> Observation:
        from envs.agent.tools import Observation

        if call.name != "read":
            return Observation(f"error: unknown tool {call.name!r}; the tool is read", error=True)
        if call.arguments:
            return Observation("error: read takes no arguments", error=True)
        self.peeks += 1
        return Observation(str(self.digit))

    def final_answer(self, text: str, closed: bool) -> None:
        """A turn without a tool call: the episode's answer (`closed`: the turn ended with the end of turn)."""
        self.answer, self.answer_closed = text, closed


def score_answer(expected: int, answer: str | None, *, closed: bool = True, peeked: bool = False) -> ScoreResult:
    """FULL iff the episode read the digit and `answer` is exactly it, its turn closed; see the module docstring."""
    error: str | None = None
    if answer is None:
        error = "missing: the episode never answered"
    elif not peeked:
        error = "answered without reading the digit"
    elif not closed:
        error = "truncated: no end of turn after the answer"
    elif _ONE_DIGIT.fullmatch(answer) is None:
        error = "not one digit"
    right = error is None and answer == str(expected)
    tests = {"format": error is None, "read": peeked, "answer": right}
    passed = sum(tests.values())
    verdict = Verdict(status="completed", patch_applied=error is None, tests_passed=passed,
                      tests_failed=len(tests) - passed, exit_code=0 if right else 1,
                      test_status={k: "PASSED" if v else "FAILED" for k, v in tests.items()},
                      resolution="FULL" if right else "NO", error=f"format error: {error}" if error else "")
    return ScoreResult(verdict, format_error=error,
                       detail=f"format error: {error}" if error else f"expected {expected}, got {answer!r}")


class PeekEnvironment:
    name = "peek"
    tools_in_process = True
    """Episodes of this environment run in the rollout worker's agent loop with `episode_tools` (no sandbox)."""

    def task_to_payload(self, task: Task) -> dict[str, Any]:
        return {"instance_id": task.instance_id, "answer": int(task.metadata["answer"])}

    def build_prompt(self, task: Task, tokenizer: Any, max_prompt_length: int, context: str = "none",
                     context_functions: int = 0) -> PromptResult:
        from envs.agent.chat import tool_prompt

        return PromptResult(*tool_prompt(tokenizer, "peek", SYSTEM_PROMPT, task.problem_statement, TOOL_SPECS,
                                         max_prompt_length=max_prompt_length, fallback=COMPACT_TOOLS))

    def episode_tools(self, payload: dict[str, Any]) -> PeekTools:
        return PeekTools(int(payload["answer"]))

    def score_tools(self, payload: dict[str, Any], tools: PeekTools) -> ScoreResult:
        return score_answer(int(payload["answer"]), tools.answer, closed=tools.answer_closed,
                            peeked=tools.peeks > 0)

    async def score(self, payload: dict[str, Any], completion_text: str, *, truncated: bool = False,
                    **_: Any) -> ScoreResult:
        """A single-shot completion (no episode, no tool): a guess, never paid (no read)."""
        return score_answer(int(payload["answer"]), completion_text, closed=not truncated)


def make_peek_environment(env_cfg: EnvConfig | None = None, **_: Any) -> PeekEnvironment:
    return PeekEnvironment()
