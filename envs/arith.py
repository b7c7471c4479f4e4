"""`arith`: a tiny verifiable environment ("What is 7 + 12?") scored without a sandbox.

Its job is to show a small model learning within minutes, so the prompt is short and the answer format is one tag
(`<answer>19</answer>`), checked leniently: case, whitespace inside the tag and a leading `+` do not matter; the last
tag wins. Verdicts are the sandbox's `Verdict` type (completed; FULL when right, NO when wrong or absent), so the
reward path (`reward_from_verdict`) is the same as for SWE tasks; an absent tag also sets `format_error`.
"""

from __future__ import annotations

import random
import re
from typing import TYPE_CHECKING, Any

from envs.registry import PromptResult, ScoreResult, Task, TaskDataset
from fleet.contracts.sandbox import Verdict

if TYPE_CHECKING:
    from fleet.config.env import DatasetConfig, EnvConfig

OPS = ("+", "-")
_NUMBER = re.compile(r"[+-]?\d+")
_ANSWER = re.compile(r"<\s*answer\s*>\s*([+-]?\s*\d+)\s*<\s*/\s*answer\s*>", re.I)
_OPEN = re.compile(r"<\s*answer\s*>", re.I)


def question(a: int, op: str, b: int, answer_format: str = "tag") -> str:
    # The number format drops the tag instruction: a model learning from scratch attends over fewer tokens.
    return f"What is {a} {op} {b}?" + (" Answer with <answer>N</answer>." if answer_format == "tag" else "")


def make_arith_tasks(seed: int, split: str, num_tasks: int, max_operand: int, ops: tuple[str, ...] = OPS,
                     answer_format: str = "tag") -> list[Task]:
    """Deterministic from (seed, split): the same arguments always give the same questions and ids."""
    rng = random.Random(f"arith:{seed}:{split}")
    tasks = []
    for i in range(num_tasks):
        a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
        if op == "-" and b > a:
            a, b = b, a  # keep answers non-negative: one less thing for a tiny model to learn
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        tasks.append(Task(instance_id=f"arith-{seed}-{split}-{i:06d}", env_name="arith",
                          problem_statement=question(a, op, b, answer_format), split=split,
                          metadata={"answer": answer, "a": a, "b": b, "op": op}))
    return tasks


def load_arith_dataset(cfg: DatasetConfig, *, env_cfg: EnvConfig | None = None, seed: int = 0, **_: Any) -> TaskDataset:
    """`data.*.dataset_name=arith`: `env.arith.num_tasks` training questions (a tenth of that for validation)."""
    from fleet.config.env import ArithEnvConfig

    arith: ArithEnvConfig = env_cfg.arith if env_cfg is not None else ArithEnvConfig()
    split = "validation" if cfg.split == "test" else cfg.split
    n = arith.num_tasks if split == "train" else max(1, min(200, arith.num_tasks // 10))
    if cfg.max_samples is not None:
        n = min(n, cfg.max_samples)
    return TaskDataset("arith", "arith", make_arith_tasks(seed, split, n, arith.max_operand, tuple(arith.ops),
                                                        arith.answer_format))


def parse_number(text: str) -> tuple[int | None, str | None]:
    """`answer_format=number`: the first integer of the completion, or (None, "missing")."""
    m = _NUMBER.search(text)
    return (int(m.group()), None) if m else (None, "missing")


def parse_answer(text: str) -> tuple[int | None, str | None]:
    """(answer, None), or (None, format error: missing | malformed | truncated)."""
    matches = _ANSWER.findall(text)
    if matches:
        return int(matches[-1].replace(" ", "")), None
    opened = list(_OPEN.finditer(text))
    if not opened:
        return None, "missing"
    tail = text[opened[-1].end():]
    return None, "truncated" if re.fullmatch(r"\s*[+-]?\s*\d*\s*", tail) else "malformed"


class ArithEnvironment:
    name = "arith"

    def __init__(self, answer_format: str = "tag") -> None:
        self.answer_format = answer_format

    def task_to_payload(self, task: Task) -> dict[str, Any]:
        return {"instance_id": task.instance_id, "answer": int(task.metadata["answer"])}

    def build_prompt(self, task: Task, tokenizer: Any, max_prompt_length: int, context: str = "none",
                     context_functions: int = 0) -> PromptResult:
        messages = [{"role": "user", "content": task.problem_statement}]
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            text = task.problem_statement + "\n"
            ids = list(tokenizer(text)["input_ids"])
        if len(ids) > max_prompt_length:
            raise ValueError(f"arith prompt of {len(ids)} tokens exceeds max_prompt_length={max_prompt_length}")
        return PromptResult(ids, text)

    async def score(self, payload: dict[str, Any], completion_text: str, **_: Any) -> ScoreResult:
        """Per-call context (`cfg=`, `truncated=`, a scorer) is accepted and not needed: no sandbox here."""
        return score_answer(int(payload["answer"]), completion_text, self.answer_format)


def score_answer(expected: int, completion_text: str, answer_format: str = "tag") -> ScoreResult:
    """Always a `completed` verdict (nothing can fail to run here) with two tests, `format` and `answer`, so that
    `pass_rate` rewards can credit a well-formed answer; a missing answer is also flagged as a format error (no
    usable answer: the reward mapping gives it `format_error_reward`)."""
    got, error = parse_number(completion_text) if answer_format == "number" else parse_answer(completion_text)
    right = error is None and got == expected
    wanted = "a number" if answer_format == "number" else "<answer>N</answer>"
    verdict = Verdict(status="completed", patch_applied=error is None, tests_passed=int(error is None) + int(right),
                      tests_failed=int(error is not None) + int(not right), exit_code=0 if right else 1,
                      test_status={"format": "FAILED" if error else "PASSED",
                                   "answer": "PASSED" if right else "FAILED"},
                      resolution="FULL" if right else "NO",
                      error=f"format error ({error}): no {wanted}" if error else "")
    detail = f"format error: {error}" if error else f"expected {expected}, got {got}"
    return ScoreResult(verdict, format_error=error, detail=detail)


def make_arith_environment(env_cfg: EnvConfig | None = None, **_: Any) -> ArithEnvironment:
    return ArithEnvironment(env_cfg.arith.answer_format if env_cfg is not None else "tag")
