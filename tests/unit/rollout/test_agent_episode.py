"""The agent loop with a scripted policy and the tiny model's real tokenizer: token-exact trajectories, masks,
budgets, truncation, error observations, timeouts, and weight versions that change mid-episode."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agent_helpers import QWEN_TOOLS_TEMPLATE, LocalBackend, ScriptedPolicy, call

from envs.agent.chat import ChatFormat
from envs.agent.tools import TOOL_SPECS, ToolBox
from fleet.tokenizer import load_tokenizer
from rollout.agent.episode import OBSERVATION_VERSION, Episode, EpisodeLimits, run_episode
from rollout.engine.base import SamplingSpec
from workshop.tinymodel import ensure_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> object:
    return load_tokenizer(ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny"))


@pytest.fixture(scope="module", params=["tiny", "qwen-tools"])
def fmt(request: pytest.FixtureRequest, tokenizer: object) -> ChatFormat:
    if request.param == "qwen-tools":
        tok = __import__("copy").deepcopy(tokenizer)
        tok.chat_template = QWEN_TOOLS_TEMPLATE
        return ChatFormat(tok)
    return ChatFormat(tokenizer)


async def _episode(fmt: ChatFormat, tmp_path: Path, turns: list[str], limits: EpisodeLimits | None = None,
                   **policy_kw: object) -> tuple[Episode, ScriptedPolicy, list[int]]:
    prompt = fmt.prompt_ids("You fix bugs.", "Make the tests pass.", TOOL_SPECS)
    policy = ScriptedPolicy(fmt, turns, **policy_kw)  # type: ignore[arg-type]
    ep = await run_episode(policy, fmt, ToolBox(LocalBackend(tmp_path)), prompt, SamplingSpec(),
                           limits or EpisodeLimits(), "g/0")
    return ep, policy, prompt


def _check_exact(ep: Episode, policy: ScriptedPolicy, prompt: list[int]) -> None:
    """Every context the engine saw is prompt + the episode's tokens so far; generated runs are the engine's."""
    generated = [t for t, m in zip(ep.token_ids, ep.loss_mask(), strict=True) if m]
    assert generated == [t for out in policy.outputs for t in out]
    for ctx in policy.contexts:
        assert ctx == prompt + ep.token_ids[: len(ctx) - len(prompt)]
    assert len(ep.logprobs) == len(ep.versions) == len(ep.token_ids)


async def test_trajectory_is_the_generated_tokens_plus_observations_exactly(fmt: ChatFormat, tmp_path: Path) -> None:
    turns = [call("shell", command="echo hello-from-shell"),
             "I will write it. " + call("file_editor", command="create", path="a/b.py", file_text="x = 1\n"),
             call("submit")]
    ep, policy, prompt = await _episode(fmt, tmp_path, turns)
    assert (ep.end_reason, ep.turns, ep.tool_calls, ep.tool_errors) == ("submitted", 3, 3, 0)
    assert (tmp_path / "a" / "b.py").read_text() == "x = 1\n"
    _check_exact(ep, policy, prompt)
    assert len(ep.observation_spans) == 2 and ep.generated_tokens + ep.observation_tokens == len(ep.token_ids)
    mask = ep.loss_mask()
    for start, n in ep.observation_spans:
        assert mask[start:start + n] == [0] * n
        assert ep.versions[start:start + n] == [OBSERVATION_VERSION] * n
        assert ep.logprobs[start:start + n] == [0.0] * n
    first_obs = fmt.tok.decode(ep.token_ids[slice(ep.observation_spans[0][0], sum(ep.observation_spans[0]))])
    assert "hello-from-shell" in first_obs and "[exit code 0]" in first_obs
    assert ep.token_ids[-1] in fmt.end_ids, "the episode ends on the model's own last token"


async def test_the_episode_text_is_what_the_template_renders_for_the_conversation(fmt: ChatFormat,
                                                                                  tmp_path: Path) -> None:
    turns = [call("shell", command="echo one"), call("submit")]
    ep, _, prompt = await _episode(fmt, tmp_path, turns)
    obs_start, obs_len = ep.observation_spans[0]
    tool_text = fmt.tok.decode(ep.token_ids[obs_start:obs_start + obs_len])
    assert "one" in tool_text
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Make the tests pass."},
                {"role": "assistant", "content": turns[0]}, {"role": "tool", "content": "one\n[exit code 0]"},
                {"role": "assistant", "content": turns[1]}]
    whole = fmt.tok.decode(prompt + ep.token_ids)
    rendered = fmt.tok.apply_chat_template(messages, tools=TOOL_SPECS, tokenize=False)
    if rendered == fmt.tok.apply_chat_template(messages, tokenize=False):  # template without tools: the fallback
        assert "<tools>" in whole and '"name": "shell"' in whole
    else:  # the same text, up to the separator the template writes after the last turn
        assert rendered.startswith(whole) and rendered[len(whole):].strip() == ""


async def test_malformed_unknown_and_missing_calls_are_error_observations(fmt: ChatFormat, tmp_path: Path) -> None:
    turns = ["<tool_call>{not json}</tool_call>", call("format_disk"), "I think it is fixed.",
             call("file_editor", command="str_replace", path="nope.py", old_str="a", new_str="b"), call("submit")]
    ep, policy, prompt = await _episode(fmt, tmp_path, turns)
    assert (ep.end_reason, ep.turns, ep.tool_errors, ep.tool_calls) == ("submitted", 5, 4, 5)
    _check_exact(ep, policy, prompt)
    texts = [fmt.tok.decode(ep.token_ids[s:s + n]) for s, n in ep.observation_spans]
    assert "not valid JSON" in texts[0] and "unknown tool 'format_disk'" in texts[1]
    assert "no tool call found" in texts[2] and "does not exist" in texts[3]


async def test_turn_budget_ends_the_episode_on_a_generated_token(fmt: ChatFormat, tmp_path: Path) -> None:
    ep, policy, prompt = await _episode(fmt, tmp_path, [call("shell", command="true")],
                                        EpisodeLimits(max_turns=3))
    assert (ep.end_reason, ep.turns, len(ep.observation_spans)) == ("max_turns", 3, 2)
    assert ep.loss_mask()[-1] == 1
    _check_exact(ep, policy, prompt)


async def test_context_budget_is_never_exceeded(fmt: ChatFormat, tmp_path: Path) -> None:
    prompt_len = len(fmt.prompt_ids("You fix bugs.", "Make the tests pass.", TOOL_SPECS))
    limits = EpisodeLimits(max_turns=50, max_total_tokens=prompt_len + 120, max_new_tokens_per_turn=40)
    ep, policy, prompt = await _episode(fmt, tmp_path, [call("shell", command="seq 1 5")], limits)
    assert ep.end_reason == "context_full"
    assert prompt_len + len(ep.token_ids) <= limits.max_total_tokens
    assert all(len(ctx) < limits.max_total_tokens for ctx in policy.contexts)
    _check_exact(ep, policy, prompt)


async def test_a_turn_cut_by_its_token_budget_is_closed_by_the_observation(fmt: ChatFormat, tmp_path: Path) -> None:
    limits = EpisodeLimits(max_turns=2, max_new_tokens_per_turn=5)
    ep, policy, prompt = await _episode(fmt, tmp_path, [call("shell", command="echo " + "x" * 200)], limits)
    start, _ = ep.observation_spans[0]
    assert ep.token_ids[start - 1] not in fmt.end_ids, "the cut turn has no end token of its own"
    assert ep.token_ids[start] in fmt.end_ids, "the observation closes the turn"
    assert ep.tool_errors == ep.turns, "a cut call is no call: answered with an error observation"
    _check_exact(ep, policy, prompt)


async def test_long_tool_output_is_truncated_with_a_marker(fmt: ChatFormat, tmp_path: Path) -> None:
    limits = EpisodeLimits(max_turns=2, max_observation_tokens=64)
    ep, _, _ = await _episode(fmt, tmp_path, [call("shell", command="seq 1 3000")], limits)
    start, n = ep.observation_spans[0]
    text = fmt.tok.decode(ep.token_ids[start:start + n])
    assert "tokens of output cut here" in text and text.count("\n") < 200
    assert n <= 64 + 40, "the cap applies to the tool output; the template adds only its few framing tokens"


async def test_wall_clock_limit_ends_the_episode_and_drops_the_unfinished_turn(fmt: ChatFormat,
                                                                               tmp_path: Path) -> None:
    policy_turns = [call("shell", command="true")]
    ep, policy, _ = await _episode(fmt, tmp_path, policy_turns, EpisodeLimits(episode_timeout_s=0.2), delay_s=60)
    assert ep.end_reason == "timeout" and ep.token_ids == [] and ep.turns == 0
    assert len(policy.contexts) == 1


async def test_a_weight_push_during_the_episode_shows_in_the_token_versions(fmt: ChatFormat, tmp_path: Path) -> None:
    turns = [call("shell", command="true"), call("shell", command="true"), call("submit")]
    ep, _, _ = await _episode(fmt, tmp_path, turns, versions=[3, 4, 4])
    generated = [v for v, m in zip(ep.versions, ep.loss_mask(), strict=True) if m]
    assert generated[0] == 3 and generated[-1] == 4 and sorted(set(generated)) == [3, 4]
    assert set(ep.versions) == {3, 4, OBSERVATION_VERSION}


async def test_many_episodes_share_one_policy_concurrently(fmt: ChatFormat, tmp_path: Path) -> None:
    async def one(i: int) -> Episode:
        (tmp_path / str(i)).mkdir()
        policy = ScriptedPolicy(fmt, [call("shell", command=f"echo {i}"), call("submit")], delay_s=0.01)
        prompt = fmt.prompt_ids("s", f"task {i}", TOOL_SPECS)
        return await run_episode(policy, fmt, ToolBox(LocalBackend(tmp_path / str(i))), prompt, SamplingSpec(),
                                 EpisodeLimits(), f"g/{i}")

    episodes = await asyncio.gather(*(one(i) for i in range(8)))
    for i, ep in enumerate(episodes):
        s, n = ep.observation_spans[0]
        assert ep.end_reason == "submitted" and f"{i}\n" in fmt.tok.decode(ep.token_ids[s:s + n])
