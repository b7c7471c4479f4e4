"""The `peek` tool environment: the answer only a tool call gives, strict scoring, episodes through the agent loop
and the worker's LocalToolRunner (scripted policy, the tiny tokenizer with `<tool_call>` as single tokens), and the
format corpus its base model is pre-trained on."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from buffer_client.wire import to_proto_trajectory
from envs.agent.parser import ToolCall
from envs.peek import CALL, QUESTION, TOOL_TOKENS, PeekTools, format_corpus, make_peek_tasks, score_answer
from envs.registry import load_dataset, make_environment
from fleet.config import MasterConfig
from fleet.config.env import DatasetConfig
from fleet.contracts.groups import PromptGroup
from fleet.tokenizer import load_tokenizer
from rollout.agent.local import LocalToolRunner
from rollout.engine.base import SamplingSpec
from rollout.scoring import reward_for
from workshop.tinymodel import ensure_tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "rollout"))
from agent_helpers import ScriptedPolicy  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tok = load_tokenizer(ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))
    tok.add_tokens(TOOL_TOKENS)  # as the base model's tokenizer has them (workshop.pretrain extra_tokens)
    return tok


def test_the_digit_is_in_no_prompt_only_the_tool_gives_it(tokenizer: Any) -> None:
    tasks = make_peek_tasks(3, "train", 2000)
    assert tasks == make_peek_tasks(3, "train", 2000) and tasks != make_peek_tasks(4, "train", 2000)
    counts = Counter(t.metadata["answer"] for t in tasks)
    assert sorted(counts) == list(range(10)) and min(counts.values()) > 150  # uniform: chance is 1/10
    env = make_environment("peek")
    prompts = {tuple(env.build_prompt(t, tokenizer, 64).token_ids) for t in tasks[:50]}
    assert len(prompts) == 1  # every task asks the same: the prompt says nothing about the digit
    text = env.build_prompt(tasks[0], tokenizer, 64).text
    assert QUESTION in text and not any(c.isdigit() for c in text)
    assert len(next(iter(prompts))) < 40  # short: every prompt token is in every training sequence
    with pytest.raises(ValueError, match=r"peek prompt of \d+ tokens exceeds max_prompt_length=8"):
        env.build_prompt(tasks[0], tokenizer, 8)
    train, val = (load_dataset(DatasetConfig(dataset_name="peek", split=s), seed=1) for s in ("train", "validation"))
    assert (len(train), len(val), val.env_name) == (20000, 200, "peek")
    assert {t.instance_id for t in train}.isdisjoint(t.instance_id for t in val)


def test_read_gives_the_digit_and_wrong_calls_are_errors() -> None:
    tools = PeekTools(7)
    run = lambda name, **kw: asyncio.run(tools.run(ToolCall(name, kw)))  # noqa: E731
    assert run("read").text == "7" and not run("read").error
    unknown, with_args = run("lookup", key="k0"), run("read", key="k0")
    assert unknown.error and "unknown tool 'lookup'" in unknown.text
    assert with_args.error and "no arguments" in with_args.text
    assert tools.peeks == 2 and tools.answer is None
    tools.final_answer("7", True)
    assert (tools.answer, tools.answer_closed) == ("7", True)


@pytest.mark.parametrize(("answer", "closed", "error"), [
    ("7", True, None), ("3", True, None), ("7 ", True, "not one digit"), ("77", True, "not one digit"),
    ("seven", True, "not one digit"), ("7", False, "truncated: no end of turn after the answer"),
    (None, True, "missing: the episode never answered"),
])
def test_only_exactly_one_digit_then_end_of_turn_scores(answer: str | None, closed: bool, error: str | None) -> None:
    cfg = MasterConfig()
    result = score_answer(7, answer, closed=closed, peeked=True)
    assert result.format_error == error
    right = answer == "7" and error is None
    assert result.verdict.resolution == ("FULL" if right else "NO")
    assert reward_for(cfg.env, "peek", result.verdict) == (1.0 if right else 0.0)  # binary: env.code's settings
    assert result.verdict.test_status["read"] == "PASSED"
    guess = score_answer(7, "7", peeked=False)  # the right digit without reading it
    assert guess.format_error == "answered without reading the digit"
    assert reward_for(cfg.env, "peek", guess.verdict) == 0.0


def _episode(tokenizer: Any, turns: list[str], digit: int = 7) -> tuple[Any, LocalToolRunner, ScriptedPolicy]:
    cfg = MasterConfig()
    cfg.env.code.agent.max_turns, cfg.env.code.agent.max_new_tokens_per_turn = 2, 16
    env = make_environment("peek", cfg.env)
    task = next(t for t in make_peek_tasks(0, "train", 100) if t.metadata["answer"] == digit)
    prompt = env.build_prompt(task, tokenizer, 64)
    runner = LocalToolRunner(cfg.env, cfg.policy, SimpleNamespace(), tokenizer)  # type: ignore[arg-type]
    policy = ScriptedPolicy(runner.fmt, turns)
    runner.engine = SimpleNamespace(generate=policy)  # type: ignore[assignment]
    group = PromptGroup(group_id="g", env_name="peek", prompt_token_ids=prompt.token_ids)
    return to_proto_trajectory(asyncio.run(runner.sample(group, env.task_to_payload(task), SamplingSpec(), 0))), \
        runner, policy


def test_read_then_the_digit_as_text_is_a_right_token_exact_episode(tokenizer: Any) -> None:
    t, runner, policy = _episode(tokenizer, [CALL, "7"])
    assert (t.reward, t.finish_reason, t.episode.turns, t.episode.tool_calls, t.episode.tool_errors) == \
        (1.0, "submitted", 2, 1, 0)
    assert len(policy.outputs[0]) == 12  # 11 + the end of turn: <tool_call> and </tool_call> one token each
    (span,) = t.observation_spans
    observed = runner.fmt.decode(list(t.response_token_ids[span.start:span.start + span.length]))
    assert observed.split() == ["tool", "7", "assistant"]  # the tool result between the turns, masked
    assert set(t.token_versions[span.start:span.start + span.length]) == {-1}
    generated = [x for i, x in enumerate(t.response_token_ids) if not span.start <= i < span.start + span.length]
    assert generated == [x for out in policy.outputs for x in out]


@pytest.mark.parametrize(("turns", "reward", "turns_taken", "calls", "errors"), [
    ([CALL, "3"], 0.0, 2, 1, 0),  # read, then a wrong digit
    (["7"], 0.0, 1, 0, 0),  # the right digit without the tool: a guess, never paid
    (['<tool_call>{"name": "read"</tool_call>', "7"], 0.0, 2, 1, 1),  # malformed JSON: an error observation
    (['<tool_call>{"name": "look"}</tool_call>', "7"], 0.0, 2, 1, 1),  # unknown tool: an error observation
    ([CALL, CALL], 0.0, 2, 2, 0),  # never answered: a format error
    ([CALL, "7 and more text than the turn budget holds"], 0.0, 2, 1, 0),  # cut at the budget: truncated
])
def test_wrong_malformed_and_unanswered_episodes(tokenizer: Any, turns: list[str], reward: float,
                                                 turns_taken: int, calls: int, errors: int) -> None:
    t, runner, _ = _episode(tokenizer, turns)
    assert (t.reward, t.episode.turns, t.episode.tool_calls, t.episode.tool_errors) == \
        (reward, turns_taken, calls, errors)


def test_format_corpus_renders_as_the_loops_episodes_with_random_answers(tokenizer: Any) -> None:
    from envs.agent.chat import ChatFormat

    fmt, env = ChatFormat(tokenizer), make_environment("peek")
    chats = list(itertools.islice(format_corpus(0), 400))
    prompt = env.build_prompt(make_peek_tasks(0, "train", 1)[0], tokenizer, 64).token_ids
    end = min(fmt.end_ids)
    chat = chats[0]
    text = tokenizer.apply_chat_template(chat, tokenize=False).rstrip("\n")
    loop = [*prompt, *fmt.encode(CALL), end, *fmt.observation_ids([chat[3]["content"]], turn_closed=True),
            *fmt.encode(chat[4]["content"]), end]
    assert list(tokenizer(text, add_special_tokens=False)["input_ids"]) == loop
    # The answer is independent of the tool's result: the base learns the format at chance level.
    assert 0.05 < sum(c[3]["content"] == c[4]["content"] for c in chats) / len(chats) < 0.15
    direct = list(itertools.islice(format_corpus(0, direct_frac=0.5), 400))
    assert 0.4 < sum(len(c) == 3 for c in direct) / len(direct) < 0.6


def test_echo_chats_copy_a_digit_from_the_user_and_never_from_a_tool() -> None:
    chats = list(itertools.islice(format_corpus(0, echo_frac=0.3), 400))
    echo = [c for c in chats if c[1]["content"] != QUESTION]
    assert 0.2 < len(echo) / len(chats) < 0.4
    for c in echo:
        assert [m["role"] for m in c] == ["system", "user", "assistant"]
        assert c[1]["content"] == f"Repeat the digit {c[2]['content']}."
    # The tool episodes keep their random answers: copying a tool's result is still never shown.
    tool = [c for c in chats if len(c) == 5]
    assert 0.05 < sum(c[3]["content"] == c[4]["content"] for c in tool) / len(tool) < 0.2


def test_the_tool_use_corpus_copies_when_it_reads_and_seldom_reads() -> None:
    plain = list(itertools.islice(format_corpus(0), 50))
    assert list(itertools.islice(format_corpus(0, copy_frac=0.0), 50)) == plain  # the recorded base's corpus
    chats = list(itertools.islice(format_corpus(0, direct_frac=0.9, copy_frac=1.0), 1000))
    tool = [c for c in chats if len(c) == 5]
    assert 0.05 < len(tool) / len(chats) < 0.15
    assert all(c[3]["content"] == c[4]["content"] for c in tool)  # every read is answered with its result


def test_the_base_model_gets_tool_tokens_as_single_kept_tokens(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from workshop.pretrain import ensure_format_model

    out = ensure_format_model(tmp_path / "base", format_corpus, name="peek", steps=1, batch=2,
                              extra_tokens=TOOL_TOKENS)
    tok = load_tokenizer(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert len(tok) == 2048 + len(TOOL_TOKENS) and model.get_input_embeddings().weight.shape[0] == 2048 + 64
    ids = tok(CALL, add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens([ids[0], ids[-1]]) == TOOL_TOKENS
    assert tok.decode(ids, skip_special_tokens=True) == CALL  # not special: decoding (the parser's input) keeps them
