"""One agent episode: turns of model output and tool results until the model submits or a budget runs out.

Token-exact: the context of turn k+1 is the prompt, every token the engine generated so far (as generated) and the
observation tokens appended between turns. The episode's response is that sequence after the prompt; generated
tokens keep their generation log-probs and weight versions (a weight push during the episode shows up as a version
change mid-trajectory), observation tokens get log-prob 0 and version `OBSERVATION_VERSION` (-1: produced by no
weights) and are listed in `observation_spans`; the trainer masks them out of the loss.

End reasons: `submitted`, `max_turns`, `context_full` (the next turn or observation would not fit in
`max_total_tokens`), `timeout` (the episode's wall clock; a turn cut short is dropped whole). A sandbox failure is
not an end reason: `SessionUnavailable` propagates and the caller gives the whole group back.

Computer use (rollout/agent/computer.py) runs the same loop with an observation before the first turn (the page's
first screenshot), observations that carry images (their placeholder runs recorded in `images`; every generation
gets the images of its whole context), one call per turn (`tools.max_calls_per_turn`) and a bound on image bytes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from envs.agent.chat import ChatFormat
from envs.agent.parser import ToolCallError, parse_tool_calls
from envs.agent.tools import Observation, ToolRunner
from rollout.engine.base import Generation, SamplingSpec

log = logging.getLogger(__name__)
OBSERVATION_VERSION = -1
EndReason = Literal["submitted", "max_turns", "context_full", "timeout"]
Generate = Callable[..., Awaitable[Generation]]  # (request_id, context, sampling[, images=...]): engine.generate
NO_CALL = ("error: no tool call found. Call a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, "
           "or call submit when you are done.")


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 8
    max_total_tokens: int = 4096
    """Prompt + every generated and observation token (the model's context)."""
    max_new_tokens_per_turn: int = 512
    max_observation_tokens: int = 512
    """Tool output tokens per turn; longer output is cut in the middle with a marker."""
    episode_timeout_s: float = 600.0
    max_image_bytes: int = 1 << 62
    """Computer use: PNG bytes of screenshots per trajectory (`policy.vision.max_image_bytes_per_trajectory`)."""


@dataclass
class Episode:
    prompt_len: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    observation_spans: list[tuple[int, int]] = field(default_factory=list)
    """(start, length) in `token_ids` of each run of observation tokens."""
    turns: int = 0
    tool_calls: int = 0
    """Tool calls attempted (a turn with a malformed call or none counts as one failed attempt)."""
    tool_errors: int = 0
    """Attempts answered with an error observation (malformed, unknown tool, bad arguments, no such file)."""
    end_reason: EndReason = "max_turns"
    last_finish: str = ""
    images: list[tuple[bytes, int, int]] = field(default_factory=list)
    """Computer use: (PNG, start, length) in `token_ids` of each screenshot's placeholder run."""

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids) - self.observation_tokens

    @property
    def observation_tokens(self) -> int:
        return sum(n for _, n in self.observation_spans)

    def add_generated(self, gen: Generation) -> None:
        self.token_ids += gen.token_ids
        self.logprobs += gen.logprobs
        self.versions += gen.token_versions
        self.last_finish = gen.finish_reason

    def add_observation(self, ids: list[int], images: Sequence[tuple[bytes, int, int]] = ()) -> None:
        self.images += [(png, len(self.token_ids) + start, n) for png, start, n in images]
        self.observation_spans.append((len(self.token_ids), len(ids)))
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.versions += [OBSERVATION_VERSION] * len(ids)

    def loss_mask(self) -> list[int]:
        mask = [1] * len(self.token_ids)
        for start, n in self.observation_spans:
            mask[start:start + n] = [0] * n
        return mask


async def run_episode(generate: Generate, fmt: ChatFormat, tools: ToolRunner, prompt_ids: Sequence[int],
                      sampling: SamplingSpec, limits: EpisodeLimits, request_id: str, *,
                      first: Observation | None = None) -> Episode:
    """`first`: an observation shown before the first turn (computer use: the page's first screenshot)."""
    episode = Episode(len(prompt_ids))
    context = list(prompt_ids)
    if first is not None:
        obs, images = fmt.observation_tokens([first], limits.max_observation_tokens, turn_closed=False)
        episode.add_observation(obs, images)
        context += obs
    try:
        async with asyncio.timeout(limits.episode_timeout_s):
            episode.end_reason = await _turns(generate, fmt, tools, context, sampling, limits, request_id, episode)
    except TimeoutError:
        episode.end_reason = "timeout"
    return episode


async def _turns(generate: Generate, fmt: ChatFormat, tools: ToolRunner, context: list[int], sampling: SamplingSpec,
                 limits: EpisodeLimits, request_id: str, episode: Episode) -> EndReason:
    for turn in range(limits.max_turns):
        room = limits.max_total_tokens - len(context)
        if room <= 0:
            return "context_full"
        spec = replace(sampling, max_new_tokens=min(limits.max_new_tokens_per_turn, room))
        images = {"images": [png for png, _, _ in episode.images]} if episode.images else {}
        gen = await generate(f"{request_id}/t{turn}", context, spec, **images)
        if len(gen.logprobs) != len(gen.token_ids) or len(gen.token_versions) != len(gen.token_ids):
            raise RuntimeError(f"engine contract: {len(gen.token_ids)} tokens, {len(gen.logprobs)} log-probs, "
                               f"{len(gen.token_versions)} versions")
        episode.add_generated(gen)
        context += gen.token_ids
        episode.turns += 1
        results, submitted = await _act(fmt.decode(gen.token_ids), tools, episode, fmt.turn_closed(gen.token_ids))
        if submitted:
            return "submitted"
        if turn == limits.max_turns - 1:
            return "max_turns"
        budget = max(1, limits.max_observation_tokens // max(1, len(results)))
        obs, obs_images = fmt.observation_tokens(results, budget, turn_closed=fmt.turn_closed(gen.token_ids))
        if len(context) + len(obs) >= limits.max_total_tokens:
            return "context_full"  # no room left for the model to answer the observation
        if sum(len(png) for png, _, _ in [*episode.images, *obs_images]) > limits.max_image_bytes:
            return "context_full"  # the trajectory's screenshots would pass policy.vision's bound
        episode.add_observation(obs, obs_images)
        context += obs
    return "max_turns"


async def _act(text: str, tools: ToolRunner, episode: Episode, closed: bool = True) -> tuple[list[Observation], bool]:
    """Run the turn's tool calls in order, up to a submit. Returns (observations, submitted). A turn without a call
    is the episode's answer for tools that take answers as text (`final_answer(text, closed)`, e.g. `envs.peek`:
    the Qwen / Hermes convention), else an error observation."""
    try:
        calls = parse_tool_calls(text)[: getattr(tools, "max_calls_per_turn", None)]
    except ToolCallError as exc:
        episode.tool_calls += 1  # an attempt that failed: counts in the error rate
        episode.tool_errors += 1
        return [Observation(f"error: {exc}", error=True)], False
    if not calls:
        final_answer = getattr(tools, "final_answer", None)
        if final_answer is not None:
            final_answer(text, closed)
            return [], True
        episode.tool_calls += 1
        episode.tool_errors += 1
        return [Observation(NO_CALL, error=True)], False
    results: list[Observation] = []
    for call in calls:
        episode.tool_calls += 1
        obs = await tools.run(call)
        if obs.submitted:
            return results, True
        episode.tool_errors += int(obs.error)
        results.append(obs)
    return results, False
