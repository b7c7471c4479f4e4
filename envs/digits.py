"""`digits`: "First digit of 4 7 1 9 2?" -> `4`, and `digits_max`: "Largest digit of 3 1 4 1 2?" -> `4`. The skill
demo's tasks (docs/performance.md, issue 21).

Why these tasks: the answer is a digit, uniform over 0-9 for `first` and over 2-9 for `max` (the largest digit is
drawn first), so a model that knows only the answer *format* (one digit, then end of turn) scores 1/10 guessing at
random, and no answer that ignores the list scores more than 1/10 (`first`) or 1/8 (`max`): chance level is known
(`chance`). The skill (read the list; copy its first element, or find its largest) applies to any list, and there are
10^5 of them: the validation questions are held out (no validation list ever appears in training), so validation
accuracy measures the skill, not memory. `max` is the demo's task: the answer depends on the list as a bag of
digits, which a tiny model's first, nearly uniform attention already carries; `first` needs attention to become
position-selective first, and a standalone GRPO sketch sat at chance for 60-130 steps before it did.
`format_corpus` is the text that teaches the format with random answers (`workshop/pretrain.py` trains on it), so
whatever the model knows about the answer beyond chance it learned from the reward.

Scoring: the completion must be the answer and nothing else: one integer (no whitespace around it), then the end of
turn. Right -> FULL (reward 1 with `env.code`'s binary mapping), a wrong digit -> NO (with `pass_rate`, partial
credit 1 - |error| / 9); no number, other text, or no end of turn before `max_new_tokens` (a truncated answer) -> a
format error (reward 0). The format is part of the reward on purpose (issue 21): when any text after the first
integer still scored, nothing in the reward depended on the end-of-turn token, so its log-prob got a zero-mean
policy gradient plus whatever the digit updates dragged along through the tied embeddings; in a sync fleet run with
trainer and engine agreeing exactly (`token_mult_prob_error` 1.0000) the end of turn fell from p = 0.98 to 0.001 in
25 steps and every answer ran to the cap ("3assistantassistantassistant"), the "collapse" first seen in async runs.
Verdicts are the sandbox's `Verdict` type, so the reward path is the one SWE tasks take. (Partial credit was tried
and is not the demo's recipe: a standalone sketch collapsed onto the middle digits, which score best on average.)
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from envs.arith import parse_number
from envs.registry import PromptResult, ScoreResult, Task, TaskDataset
from fleet.contracts.sandbox import Verdict

if TYPE_CHECKING:
    from fleet.config.env import DatasetConfig, EnvConfig

LIST_LENGTH = 5
NUM_TRAIN_TASKS = 20000
NUM_VALIDATION_TASKS = 200
CHANCE = 0.1
"""Accuracy of a uniformly random digit, and of any answer to `first` that ignores the list."""
MAX_LOWEST = 2
"""`max` lists have a largest digit of at least 2. Smaller maxima have too few lists to hold any out: max 0 is the
single list "0 0 0 0 0" and max 1 has 31. With maxima 0-9, validation (200 lists, ~10% of them the all-zero list)
held out every list whose answer is 0, so training never rewarded the answer 0 and never could: validation topped
out near 0.8 (an async run of seed 2 sat at 0.78 for 60 steps with a training reward of 0.98, issue 21), and
training kept only 12-19 of the 31 lists with max 1. Max 2 has 211 lists, of which validation holds ~25."""


def chance(kind: str = "first") -> float:
    """The best accuracy of an answer that ignores the list: 1/10 for `first`, 1/8 for `max` (always "9", say)."""
    return CHANCE if kind == "first" else 1 / (10 - MAX_LOWEST)


QUESTIONS = {"first": "First digit of", "max": "Largest digit of"}


def question(digits: list[int], kind: str = "first") -> str:
    return f"{QUESTIONS[kind]} " + " ".join(map(str, digits)) + "?"


def answer(digits: list[int], kind: str = "first") -> int:
    return digits[0] if kind == "first" else max(digits)


def _lists(rng: random.Random, kind: str = "first") -> Iterator[list[int]]:
    """Uniform digits for `first`. For `max` the largest digit m is drawn uniformly from MAX_LOWEST..9 first (the
    other digits are uniform in 0..m, m placed at a random position), so that the answer is uniform too: a plain
    list of 5 random digits has max 9 41% of the time, and "always 9" would be a 41% chance level."""
    while True:
        if kind == "first":
            yield [rng.randrange(10) for _ in range(LIST_LENGTH)]
        else:
            m = rng.randrange(MAX_LOWEST, 10)
            digits = [rng.randrange(m + 1) for _ in range(LIST_LENGTH)]
            digits[rng.randrange(LIST_LENGTH)] = m
            yield digits


def make_digits_tasks(seed: int, split: str, num_tasks: int, kind: str = "first") -> list[Task]:
    """Deterministic from (seed, split, kind). Training lists never include a validation list of the same seed. For
    `max`, lists with max 2 are the fewest (211), so they are ~10% rarer in training than the others; validation
    answers stay uniform."""
    if kind not in QUESTIONS:
        raise ValueError(f"digits task kind {kind!r}: expected one of {', '.join(QUESTIONS)}")
    val_rng = random.Random(f"digits:{kind}:{seed}:validation")
    held_out = {tuple(d) for d in _take(_lists(val_rng, kind), NUM_VALIDATION_TASKS)}
    rng = random.Random(f"digits:{kind}:{seed}:{split}")
    tasks: list[Task] = []
    for digits in _lists(rng, kind):
        if len(tasks) == num_tasks:
            break
        if split != "validation" and tuple(digits) in held_out:
            continue
        tasks.append(Task(instance_id=f"digits-{kind}-{seed}-{split}-{len(tasks):06d}", env_name="digits",
                          problem_statement=question(digits, kind), split=split,
                          metadata={"answer": answer(digits, kind), "digits": digits}))
    return tasks


def _take(it: Iterator[list[int]], n: int) -> list[list[int]]:
    return [next(it) for _ in range(n)]


def load_digits_dataset(cfg: DatasetConfig, *, seed: int = 0, kind: str = "first", **_: Any) -> TaskDataset:
    """`data.*.dataset_name=digits` (first digit) or `digits_max` (largest digit): 20000 training questions, 200
    held-out validation ones (`test` reads those)."""
    split = "validation" if cfg.split == "test" else cfg.split
    n = NUM_VALIDATION_TASKS if split == "validation" else NUM_TRAIN_TASKS
    if cfg.max_samples is not None:
        n = min(n, cfg.max_samples)
    return TaskDataset(cfg.dataset_name, "digits", make_digits_tasks(seed, split, n, kind))


def load_digits_max_dataset(cfg: DatasetConfig, **kwargs: Any) -> TaskDataset:
    return load_digits_dataset(cfg, **{**kwargs, "kind": "max"})


def format_corpus(seed: int, kind: str = "first") -> Iterator[tuple[str, str]]:
    """(question, answer) pairs whose answers are random digits, independent of the list: they teach the format and
    nothing about which digit is right. Drawn from a stream of their own, so they are not the RL questions."""
    rng = random.Random(f"digits:format:{kind}:{seed}")
    for digits in _lists(rng, kind):
        yield question(digits, kind), str(rng.randrange(10))


def max_format_corpus(seed: int) -> Iterator[tuple[str, str]]:
    return format_corpus(seed, "max")


class DigitsEnvironment:
    name = "digits"

    def task_to_payload(self, task: Task) -> dict[str, Any]:
        return {"instance_id": task.instance_id, "answer": int(task.metadata["answer"])}

    def build_prompt(self, task: Task, tokenizer: Any, max_prompt_length: int, context: str = "none",
                     context_functions: int = 0) -> PromptResult:
        text = tokenizer.apply_chat_template([{"role": "user", "content": task.problem_statement}], tokenize=False,
                                             add_generation_prompt=True)
        ids = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if len(ids) > max_prompt_length:
            raise ValueError(f"digits prompt of {len(ids)} tokens exceeds max_prompt_length={max_prompt_length}")
        return PromptResult(ids, text)

    async def score(self, payload: dict[str, Any], completion_text: str, *, truncated: bool = False,
                    **_: Any) -> ScoreResult:
        return score_digit(int(payload["answer"]), completion_text, truncated=truncated)


# Exactly the number: no whitespace around it either. A token that changes nothing in the reward drifts (an async
# run of seed 2 moved to " 4"-style answers, a space token first, and from there collapsed into empty answers).
_ANSWER_ONLY = re.compile(r"([+-]?\d+)")


def score_digit(expected: int, completion_text: str, *, truncated: bool = False) -> ScoreResult:
    """Nine "closeness" tests, of which 9 - |answer - expected| pass (a number outside 0-9 passes none), so that
    `pass_rate` rewards (`env.code.reward_mode`, which environments without a section of their own use) give
    1 - |error| / 9; `binary` rewards count FULL (the exact digit) only, as validation always does. Anything but
    one integer ended by the end of turn (`truncated`: the answer hit `max_new_tokens`) is a format error: see the
    module docstring for why the end of turn must count."""
    match = _ANSWER_ONLY.fullmatch(completion_text)
    got: int | None = None
    error: str | None = None
    if truncated:
        error = "truncated: no end of turn after the answer"
    elif match is None:
        error = parse_number(completion_text.strip())[1] or "extra text around the answer"
    else:
        got = int(match.group(1))
    right = error is None and got == expected
    passed = 0 if got is None or not 0 <= got <= 9 else 9 - abs(got - expected)
    verdict = Verdict(status="completed", patch_applied=error is None, tests_passed=passed,
                      tests_failed=9 - passed, exit_code=0 if right else 1,
                      test_status={"answer": "PASSED" if right else "FAILED"},
                      resolution="FULL" if right else "NO", error=f"format error: {error}" if error else "")
    return ScoreResult(verdict, format_error=error,
                       detail=f"format error: {error}" if error else f"expected {expected}, got {got}")


def make_digits_environment(env_cfg: EnvConfig | None = None, **_: Any) -> DigitsEnvironment:
    return DigitsEnvironment()
