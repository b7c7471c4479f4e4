import asyncio

import pytest

from envs.arith import make_arith_tasks, parse_answer, parse_number
from envs.registry import load_dataset, make_environment
from fleet.config.env import DatasetConfig, EnvConfig
from fleet.contracts.sandbox import Verdict
from sandbox_client import reward_from_verdict


def test_tasks_are_deterministic_from_seed_and_split():
    a = make_arith_tasks(3, "train", 50, 20)
    assert a == make_arith_tasks(3, "train", 50, 20)
    assert a != make_arith_tasks(4, "train", 50, 20)
    assert {t.instance_id for t in a}.isdisjoint(t.instance_id for t in make_arith_tasks(3, "validation", 50, 20))
    for t in a:
        x, op, y = t.metadata["a"], t.metadata["op"], t.metadata["b"]
        assert 0 <= x <= 20 and 0 <= y <= 20 and t.metadata["answer"] >= 0
        assert t.problem_statement == f"What is {x} {op} {y}? Answer with <answer>N</answer>."
        assert t.metadata["answer"] == (x + y if op == "+" else x - y)


def test_dataset_reads_env_arith_settings():
    env = EnvConfig.model_validate({"arith": {"max_operand": 5, "num_tasks": 30}})
    train = load_dataset(DatasetConfig(dataset_name="arith"), env_cfg=env, seed=1)
    val = load_dataset(DatasetConfig(dataset_name="arith", split="validation"), env_cfg=env, seed=1)
    assert (len(train), len(val), train.env_name) == (30, 3, "arith")
    assert max(t.metadata["a"] for t in train) <= 5


@pytest.mark.parametrize(("text", "expected"), [
    ("<answer>19</answer>", (19, None)),
    ("Let me think. 7 + 12 = 19.\n< ANSWER >  19 \n</answer>", (19, None)),
    ("<answer>3</answer> no wait <answer>+4</answer>", (4, None)),
    ("19", (None, "missing")),
    ("<answer>1", (None, "truncated")),
    ("<answer>nineteen</answer>", (None, "malformed")),
])
def test_answer_parsing_is_tolerant_of_case_and_whitespace(text, expected):
    assert parse_answer(text) == expected


def test_scores_are_sandbox_verdicts():
    env = make_environment("arith")
    task = make_arith_tasks(0, "train", 1, 20)[0]
    payload = env.task_to_payload(task)
    right = asyncio.run(env.score(payload, f"<answer> {task.metadata['answer']} </answer>"))
    wrong = asyncio.run(env.score(payload, f"<answer>{task.metadata['answer'] + 1}</answer>"))
    absent = asyncio.run(env.score(payload, "no idea", cfg=None, truncated=True))  # worker context is accepted
    assert isinstance(right.verdict, Verdict)
    assert (right.verdict.status, right.verdict.resolution, right.format_error) == ("completed", "FULL", None)
    assert (wrong.verdict.status, wrong.verdict.resolution, wrong.format_error) == ("completed", "NO", None)
    assert (absent.verdict.status, absent.verdict.resolution, absent.format_error) == ("completed", "NO", "missing")


def test_prompt_is_short_and_templated(chat_tokenizer):
    env = make_environment("arith")
    task = make_arith_tasks(0, "train", 1, 20)[0]
    r = env.build_prompt(task, chat_tokenizer, 256)
    assert task.problem_statement in r.text and r.text.endswith("<|im_start|>assistant\n")
    assert len(r.token_ids) < 100


@pytest.mark.parametrize(("text", "expected"), [
    ("7", (7, None)),
    (" the sum is 12, not 13", (12, None)),
    ("-3 apples", (-3, None)),
    ("no digits here", (None, "missing")),
])
def test_number_format_takes_the_first_integer(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize(("mode", "rewards"), [("binary", (1.0, 0.0, -0.5)), ("pass_rate", (1.0, 0.5, -0.5))])
def test_pass_rate_credits_a_well_formed_wrong_answer_through_the_shared_reward_path(mode, rewards):
    env_cfg = EnvConfig.model_validate(
        {"arith": {"answer_format": "number", "reward_mode": mode, "format_error_reward": -0.5}})
    env = make_environment("arith", env_cfg)
    task = make_arith_tasks(0, "train", 1, 20)[0]
    payload, answer = env.task_to_payload(task), task.metadata["answer"]
    got = []
    for text in (f"{answer}", f"{answer + 1} maybe", "no idea"):
        verdict = asyncio.run(env.score(payload, text)).verdict
        got.append(reward_from_verdict(verdict, *env_cfg.reward_settings("arith")))
    assert tuple(got) == rewards
    assert env_cfg.reward_settings("swe") == ("binary", 0.0)  # other environments keep env.code's settings


def test_ops_setting_restricts_the_operators():
    env = EnvConfig.model_validate({"arith": {"ops": ["+"], "max_operand": 4}})
    tasks = load_dataset(DatasetConfig(dataset_name="arith"), env_cfg=env, seed=0)
    assert {t.metadata["op"] for t in tasks} == {"+"}
    with pytest.raises(ValueError, match="ops"):
        EnvConfig.model_validate({"arith": {"ops": ["/"]}})
