"""Agent-mode samples for the rollout worker: one sandbox session per episode, graded on finish.

`RolloutWorker.process_group` hands a SWE group's samples here when `env.code.mode` is `agent`; the G episodes of a
group, and those of every group in flight, run concurrently on the worker's one engine (its batching spans them).
The session belongs to the worker (`owner` = worker id): if the worker is killed, its heartbeats stop and the
executor removes the session. A sandbox failure at any point raises `ScoringUnavailable`, so the group goes back
to the queue: it never becomes a zero reward.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

from envs.agent.chat import ChatFormat
from envs.agent.tools import ToolBox
from fleet.contracts.groups import EpisodeInfo, PromptGroup, Trajectory
from fleet.contracts.sandbox import Verdict
from rollout.agent.episode import Episode, EpisodeLimits, run_episode
from rollout.engine.base import SamplingSpec
from rollout.scoring import ScoringUnavailable, reward_for
from sandbox_client.results import SandboxUnavailable
from sandbox_client.sessions import SessionClient

if TYPE_CHECKING:
    from fleet.config.env import AgentConfig, EnvConfig
    from fleet.config.policy import PolicyConfig
    from rollout.engine.base import GenerationEngine

log = logging.getLogger(__name__)
AGENT_ENVS = frozenset({"swe"})


def limits_from_config(a: AgentConfig, policy: PolicyConfig) -> EpisodeLimits:
    """An episode's budgets: `env.code.agent`, bounded by what the engine and the trainer hold (`policy`)."""
    longest = policy.max_total_sequence_length
    if a.max_total_tokens is not None and a.max_total_tokens > longest:
        # The engine's context and the trainer's sequences end there: a longer episode could be neither.
        raise ValueError(f"env.code.agent.max_total_tokens={a.max_total_tokens} exceeds "
                         f"policy.max_total_sequence_length={longest}")
    return EpisodeLimits(
        max_turns=a.max_turns, max_total_tokens=a.max_total_tokens or longest,
        max_new_tokens_per_turn=a.max_new_tokens_per_turn or policy.generation.max_new_tokens,
        max_observation_tokens=a.max_observation_tokens, episode_timeout_s=a.episode_timeout_s)


class AgentRunner:
    """Reads `env` (the sandbox, task timeout, agent budgets, reward settings) and `policy` (what bounds the
    budgets); `rollout/server.py` hands it both."""

    def __init__(self, env: EnvConfig, policy: PolicyConfig, engine: GenerationEngine, tokenizer: Any,
                 owner: str) -> None:
        self.env, self.engine = env, engine
        self.fmt = ChatFormat(tokenizer)
        # One owner per process: a restarted worker of the same id must not keep its predecessor's sessions alive.
        self.sessions = SessionClient.from_config(env.code, f"{owner}/{uuid.uuid4().hex[:12]}")
        self.limits = limits_from_config(env.code.agent, policy)
        self.end_reasons: Counter[str] = Counter()
        self.tool_calls = self.tool_errors = 0

    @staticmethod
    def handles(env_name: str) -> bool:
        """Whether this runner plays `env_name`'s samples (the worker makes one only in agent mode)."""
        return env_name in AGENT_ENVS

    async def close(self) -> None:
        await self.sessions.close()

    def summary(self) -> dict[str, Any]:
        return {"episodes": sum(self.end_reasons.values()), "end_reasons": dict(self.end_reasons),
                "tool_calls": self.tool_calls, "tool_errors": self.tool_errors}

    async def sample(self, prompt: PromptGroup, payload: dict[str, Any], sampling: SamplingSpec,
                     index: int) -> Trajectory:
        from envs.swe.payload import payload_to_spec

        spec = payload_to_spec(payload, "", timeout=self.env.code.task_timeout,
                               fail_to_pass_first=self.env.code.fail_to_pass_first)
        t0 = time.monotonic()
        try:
            session = await self.sessions.open(spec)
            try:
                tools = ToolBox(session, command_timeout_s=self.env.code.agent.command_timeout_s)
                episode = await run_episode(self.engine.generate, self.fmt, tools, prompt.prompt_token_ids, sampling,
                                            self.limits, f"{prompt.group_id}/{index}/{time.monotonic_ns()}")
                t1 = time.monotonic()
                verdict, _ = await session.finish(total_s=self.env.code.task_timeout + 120, grade_unchanged=False)
            finally:
                await session.close()
        except SandboxUnavailable as exc:  # 400/401 (a configuration bug) propagate: the worker logs them loudly
            raise ScoringUnavailable(f"sandbox session failed during an episode: {exc}") from exc
        if not episode.token_ids:
            raise ScoringUnavailable("the episode timed out before its first turn ended (env.code.agent."
                                     "episode_timeout_s is too short for this engine)")
        if verdict.is_infra_failure:
            raise ScoringUnavailable(f"grading the episode failed: {verdict.error}")
        self._count(episode)
        return _trajectory(episode, verdict, reward_for(self.env, prompt.env_name, verdict), t1 - t0,
                           time.monotonic() - t1)

    def _count(self, episode: Episode) -> None:
        self.end_reasons[episode.end_reason] += 1
        self.tool_calls += episode.tool_calls
        self.tool_errors += episode.tool_errors


def _trajectory(ep: Episode, verdict: Verdict, reward: float, episode_s: float, grading_s: float) -> Trajectory:
    """An episode as its trajectory, token for token (observation spans kept: the trainer masks them)."""
    return Trajectory(
        ep.token_ids, ep.logprobs, ep.versions, reward, verdict, ep.end_reason, generation_s=episode_s,
        scoring_s=grading_s, observation_spans=list(ep.observation_spans),
        episode=EpisodeInfo(turns=ep.turns, tool_calls=ep.tool_calls, tool_errors=ep.tool_errors,
                            end_reason=ep.end_reason, generated_tokens=ep.generated_tokens,
                            observation_tokens=ep.observation_tokens),
    )
