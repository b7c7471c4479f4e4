import asyncio
import itertools

import pytest

from envs.digits import CHANCE, MAX_LOWEST, NUM_VALIDATION_TASKS, chance, format_corpus, make_digits_tasks, score_digit
from envs.registry import load_dataset, make_environment
from fleet.config.env import DatasetConfig, EnvConfig
from sandbox_client import reward_from_verdict


def test_validation_lists_never_appear_in_training():
    train = make_digits_tasks(3, "train", 20000)
    val = load_dataset(DatasetConfig(dataset_name="digits", split="validation"), seed=3)
    assert len(val) == NUM_VALIDATION_TASKS and val.env_name == "digits"
    assert {t.problem_statement for t in train}.isdisjoint(t.problem_statement for t in val)
    assert make_digits_tasks(3, "train", 50) == train[:50]  # deterministic from (seed, split)
    assert make_digits_tasks(4, "train", 50) != train[:50]


def test_answer_is_the_first_digit_and_uniform():
    tasks = make_digits_tasks(1, "train", 5000)
    for t in tasks[:50]:
        digits = t.metadata["digits"]
        assert t.problem_statement == "First digit of " + " ".join(map(str, digits)) + "?"
        assert t.metadata["answer"] == digits[0]
    counts = [sum(t.metadata["answer"] == d for t in tasks) for d in range(10)]
    assert all(abs(c / len(tasks) - CHANCE) < 0.02 for c in counts)  # so any list-blind answer scores ~1/10


def test_format_corpus_answers_do_not_depend_on_the_list():
    pairs = list(itertools.islice(format_corpus(0), 4000))
    agree = sum(q.split()[3] == a for q, a in pairs) / len(pairs)  # "First digit of D ..." -> D
    assert abs(agree - CHANCE) < 0.03
    assert list(itertools.islice(format_corpus(0), 5)) == pairs[:5]


def test_scoring_is_binary_through_the_shared_reward_path():
    env = make_environment("digits", EnvConfig())
    right = asyncio.run(env.score({"answer": 4}, "4"))
    wrong = asyncio.run(env.score({"answer": 4}, "5"))
    none = asyncio.run(env.score({"answer": 4}, "four"))
    mode, fmt_reward = EnvConfig().reward_settings("digits")
    assert [reward_from_verdict(r.verdict, mode, fmt_reward) for r in (right, wrong, none)] == [1.0, 0.0, 0.0]
    assert (right.verdict.resolution, wrong.verdict.resolution) == ("FULL", "NO")
    assert none.format_error == "missing" and score_digit(4, "47").verdict.resolution == "NO"


def test_largest_digit_task_has_uniform_answers_and_held_out_lists():
    train = load_dataset(DatasetConfig(dataset_name="digits_max"), seed=2)
    val = load_dataset(DatasetConfig(dataset_name="digits_max", split="validation"), seed=2)
    assert {t.problem_statement for t in train}.isdisjoint(t.problem_statement for t in val)
    for t in train[:200]:
        assert t.problem_statement == "Largest digit of " + " ".join(map(str, t.metadata["digits"])) + "?"
        assert t.metadata["answer"] == max(t.metadata["digits"])
    # Validation answers are uniform over 2-9 (plain random lists have max 9 41% of the time). Training loses the
    # lists held out, so max 2, the fewest lists (211), is a little rarer there.
    val_counts = [sum(t.metadata["answer"] == d for t in val) for d in range(10)]
    assert val_counts[:MAX_LOWEST] == [0] * MAX_LOWEST and all(12 <= c <= 40 for c in val_counts[2:]), val_counts
    counts = [sum(t.metadata["answer"] == d for t in train) for d in range(10)]
    assert counts[:MAX_LOWEST] == [0] * MAX_LOWEST
    counts = counts[MAX_LOWEST:]
    assert max(counts) / min(counts) < 1.3, counts


def test_every_validation_answer_of_the_largest_digit_task_is_rewarded_in_training():
    # Issue 21: with maxima 0-9 the all-zero list was held out for validation, so the answer 0 was never right in
    # training and ~10% of validation could not be learned.
    for seed in (1, 2, 3):
        train = {t.metadata["answer"] for t in make_digits_tasks(seed, "train", 5000, "max")}
        assert {t.metadata["answer"] for t in make_digits_tasks(seed, "validation", 200, "max")} <= train
    assert chance("max") == 1 / 8 and chance("first") == CHANCE


def test_unknown_task_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="'median'"):
        make_digits_tasks(0, "train", 1, "median")


def test_an_answer_counts_only_when_it_is_the_whole_completion_ended_by_the_end_of_turn():
    # Issue 21: when text after the first integer still scored, the end-of-turn token's log-prob had no reward
    # behind it and drifted away in a sync fleet run ("3assistantassistantassistant" scored as 3).
    env = make_environment("digits", EnvConfig())
    mode, fmt_reward = EnvConfig().reward_settings("digits")

    def reward(text: str, truncated: bool = False) -> float:
        result = asyncio.run(env.score({"answer": 3}, text, truncated=truncated))
        return reward_from_verdict(result.verdict, mode, fmt_reward)

    assert reward("3") == 1.0
    assert reward("3assistantassistantassistant") == 0.0
    assert reward(" 3") == reward("3\n") == 0.0  # a whitespace token is no more neutral than any other
    assert reward("3", truncated=True) == 0.0  # the cap came before the end of turn
    trailing = score_digit(3, "3 is the largest")
    assert trailing.verdict.resolution == "NO" and trailing.format_error == "extra text around the answer"
    assert score_digit(3, "3", truncated=True).format_error.startswith("truncated")
