"""The `lookup` tool environment: tasks, in-process tool results, scoring, and an episode through the agent loop
(scripted policy, the tiny model's tokenizer) and the worker's LocalToolRunner."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from buffer_client.wire import to_proto_trajectory
from envs.agent.parser import ToolCall
from envs.lookup import LookupTools, make_lookup_tasks, score_episode
from envs.registry import load_dataset, make_environment
from fleet.config import MasterConfig
from fleet.config.env import DatasetConfig, EnvConfig, LookupEnvConfig
from fleet.contracts.groups import PromptGroup
from fleet.tokenizer import load_tokenizer
from rollout.agent.local import LocalToolRunner
from rollout.engine.base import SamplingSpec
from rollout.scoring import reward_for
from workshop.tinymodel import ensure_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from agent_helpers import ScriptedPolicy, call  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    return load_tokenizer(ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


def test_tasks_are_deterministic_and_values_are_random_per_task() -> None:
    cfg = LookupEnvConfig(num_keys=5, table_size=3)
    a = make_lookup_tasks(1, "train", 200, cfg)
    assert a == make_lookup_tasks(1, "train", 200, cfg) and a != make_lookup_tasks(2, "train", 200, cfg)
    for t in a:
        table = t.metadata["table"]
        assert len(table) == 3 and t.metadata["key"] in table and t.metadata["answer"] == table[t.metadata["key"]]
        assert all(10 <= v <= 99 for v in table.values()) and str(t.metadata["answer"]) not in t.problem_statement
    # The same key asks for many different values: nothing but the tool can tell the answer.
    values_of_k0 = {t.metadata["answer"] for t in a if t.metadata["key"] == "k0"}
    assert len(values_of_k0) > 10


def test_dataset_reads_env_lookup_settings_and_refuses_a_table_larger_than_the_keys() -> None:
    env = EnvConfig.model_validate({"lookup": {"num_tasks": 30, "num_keys": 3, "table_size": 2}})
    train = load_dataset(DatasetConfig(dataset_name="lookup"), env_cfg=env, seed=1)
    val = load_dataset(DatasetConfig(dataset_name="lookup", split="validation"), env_cfg=env, seed=1)
    assert (len(train), len(val), train.env_name) == (30, 3, "lookup")
    with pytest.raises(ValueError, match="table_size=4 exceeds env.lookup.num_keys=3"):
        make_lookup_tasks(0, "train", 1, LookupEnvConfig(num_keys=3, table_size=4))


def test_tools_return_the_tables_value_only_for_its_key_and_answer_ends() -> None:
    tools = LookupTools({"k1": 57, "k2": 13})
    run = lambda name, **kw: asyncio.run(tools.run(ToolCall(name, kw)))  # noqa: E731
    assert (run("lookup", key="k1").text, run("lookup", key="k2").text) == ("57", "13")
    missing, bad = run("lookup", key="k9"), run("lookup", key=1)
    assert missing.error and "no key 'k9'" in missing.text and bad.error and "'key' must be a string" in bad.text
    unknown = run("shell", command="ls")
    assert unknown.error and "unknown tool 'shell'" in unknown.text
    done = run("answer", value=" 57 ")
    assert done.submitted and tools.answer == "57" and tools.lookups == ["k1", "k2", "k9"]


def test_scoring_right_wrong_and_missing_answers_through_the_reward_mapping() -> None:
    cfg = MasterConfig()
    right, wrong, missing = score_episode(57, "57"), score_episode(57, "58"), score_episode(57, None)
    assert (right.verdict.resolution, wrong.verdict.resolution, missing.format_error) == ("FULL", "NO", "missing")
    assert [reward_for(cfg.env, "lookup", r.verdict) for r in (right, wrong, missing)] == [1.0, 0.0, 0.0]
    cfg.env.lookup.reward_mode, cfg.env.lookup.format_error_reward = "pass_rate", -0.5
    looked_up_wrong = score_episode(57, "58", looked_up=True)
    assert [reward_for(cfg.env, "lookup", r.verdict) for r in (right, wrong, missing)] == [2 / 3, 1 / 3, -0.5]
    assert reward_for(cfg.env, "lookup", looked_up_wrong.verdict) == 2 / 3
    assert reward_for(cfg.env, "lookup", score_episode(57, "57", looked_up=True).verdict) == 1.0
    env = make_environment("lookup")
    guessed = asyncio.run(env.score({"answer": 57}, call("answer", value="57")))
    assert guessed.verdict.resolution == "FULL"  # a single-shot completion is a guess, graded the same way


def test_an_episode_through_the_local_runner_is_token_exact_and_graded(tokenizer: object) -> None:
    cfg = MasterConfig()
    cfg.env.code.agent.max_turns = 3
    env = make_environment("lookup", cfg.env)
    task = make_lookup_tasks(0, "train", 1, cfg.env.lookup)[0]
    key, value = task.metadata["key"], task.metadata["answer"]
    prompt = env.build_prompt(task, tokenizer, 512)
    assert len(prompt.token_ids) < 100  # the compact tools block: a learning run trains on episodes
    runner = LocalToolRunner(cfg.env, cfg.policy, SimpleNamespace(), tokenizer)  # type: ignore[arg-type]
    policy = ScriptedPolicy(runner.fmt, [call("lookup", key=key), call("answer", value=str(value))])
    runner.engine = SimpleNamespace(generate=policy)  # type: ignore[assignment]
    group = PromptGroup(group_id="g", env_name="lookup", prompt_token_ids=prompt.token_ids)
    t = to_proto_trajectory(asyncio.run(runner.sample(group, env.task_to_payload(task), SamplingSpec(), 0)))
    assert (t.reward, t.finish_reason, t.episode.turns, t.episode.tool_calls, t.episode.tool_errors) == \
        (1.0, "submitted", 2, 2, 0)
    (span,) = t.observation_spans
    observed = runner.fmt.decode(list(t.response_token_ids[span.start:span.start + span.length]))
    assert observed.split() == ["tool", str(value), "assistant"]  # the tool result between the turns, masked
    assert set(t.token_versions[span.start:span.start + span.length]) == {-1}
    generated = [x for i, x in enumerate(t.response_token_ids) if not span.start <= i < span.start + span.length]
    assert generated == [x for out in policy.outputs for x in out]
    assert runner.summary() == {"episodes": 1, "end_reasons": {"submitted": 1}, "tool_calls": 2, "tool_errors": 0}
