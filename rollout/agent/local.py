"""Agent episodes whose tools run in the rollout worker's process (`envs.lookup`): no sandbox session.

The episode is the one of agent mode (`run_episode`: same parser, chat format, token-exact trajectory, observation
masks and budgets from `env.code.agent`); only the tools differ: the environment makes them per sample from the
task's payload (`env.episode_tools(payload)`) and grades what they recorded (`env.score_tools(payload, tools)`),
and the verdict goes through the one reward mapping (`reward_for`). An environment opts in with
`tools_in_process = True`; every episode of such an environment is multi-turn, whatever `env.code.mode` says.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any

from envs.agent.chat import ChatFormat
from fleet.contracts.groups import PromptGroup, Trajectory
from rollout.agent.episode import EpisodeLimits, run_episode
from rollout.agent.runner import _trajectory, limits_from_config
from rollout.engine.base import SamplingSpec
from rollout.scoring import ScoringUnavailable, reward_for

if TYPE_CHECKING:
    from fleet.config.env import EnvConfig
    from fleet.config.policy import PolicyConfig
    from rollout.engine.base import GenerationEngine

LOCAL_TOOL_ENVS = frozenset({"lookup", "peek"})


class LocalToolRunner:
    def __init__(self, env: EnvConfig, policy: PolicyConfig, engine: GenerationEngine, tokenizer: Any) -> None:
        self.env, self.policy, self.engine, self.tokenizer = env, policy, engine, tokenizer
        # Made on first use: a worker that never leases such a task needs neither (nor valid agent budgets).
        self._limits: EpisodeLimits | None = None
        self._fmt: ChatFormat | None = None
        self._envs: dict[str, Any] = {}
        self.end_reasons: Counter[str] = Counter()
        self.tool_calls = self.tool_errors = 0

    @property
    def fmt(self) -> ChatFormat:
        if self._fmt is None:
            self._fmt = ChatFormat(self.tokenizer)
        return self._fmt

    @property
    def limits(self) -> EpisodeLimits:
        if self._limits is None:
            self._limits = limits_from_config(self.env.code.agent, self.policy)
        return self._limits

    @staticmethod
    def handles(env_name: str) -> bool:
        return env_name in LOCAL_TOOL_ENVS

    def _env(self, name: str) -> Any:
        if name not in self._envs:
            from envs.registry import make_environment

            env = make_environment(name, self.env)
            if not getattr(env, "tools_in_process", False):
                raise ValueError(f"environment {name!r} has no in-process tools (tools_in_process)")
            self._envs[name] = env
        return self._envs[name]

    def summary(self) -> dict[str, Any]:
        return {"episodes": sum(self.end_reasons.values()), "end_reasons": dict(self.end_reasons),
                "tool_calls": self.tool_calls, "tool_errors": self.tool_errors}

    async def sample(self, prompt: PromptGroup, payload: dict[str, Any], sampling: SamplingSpec,
                     index: int) -> Trajectory:
        env = self._env(prompt.env_name)
        tools = env.episode_tools(payload)
        t0 = time.monotonic()
        episode = await run_episode(self.engine.generate, self.fmt, tools, prompt.prompt_token_ids, sampling,
                                    self.limits, f"{prompt.group_id}/{index}/{time.monotonic_ns()}")
        t1 = time.monotonic()
        if not episode.token_ids:
            raise ScoringUnavailable("the episode timed out before its first turn ended (env.code.agent."
                                     "episode_timeout_s is too short for this engine)")
        verdict = env.score_tools(payload, tools).verdict
        self.end_reasons[episode.end_reason] += 1
        self.tool_calls += episode.tool_calls
        self.tool_errors += episode.tool_errors
        return _trajectory(episode, verdict, reward_for(self.env, prompt.env_name, verdict), t1 - t0,
                           time.monotonic() - t1)
