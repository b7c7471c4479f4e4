"""Scoring a completion: the environment named by the prompt group turns text into a verdict (the SWE environment
through the sandbox fleet), and `sandbox_client.reward_from_verdict` — the project's only reward mapping — turns the
verdict into a reward. Infrastructure failures raise `ScoringUnavailable`; they are never scored as a failed patch.
No protobuf here: a verdict becomes the wire's message in the buffer client (`buffer_client/wire.py`)."""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fleet.config.env import EnvConfig
from fleet.contracts.sandbox import TaskSpec, Verdict
from fleet.singleflight import SingleFlight

log = logging.getLogger(__name__)

# Retries spent by the scoring running in this asyncio task. Scorings run concurrently on one Scorer, so a shared
# before/after difference of the total would count the others' retries too.
_retries_here: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("scorer_retries", default=None)


class ScoringUnavailable(RuntimeError):
    """The scoring infrastructure failed (after retries); the group must be retried, not scored."""


def reward_for(env: EnvConfig, env_name: str, verdict: Verdict) -> float:
    """The reward of a verdict under the run's settings for `env_name` (`env`, the config's `env` section): single-shot
    answers and agent episodes alike."""
    from sandbox_client import reward_from_verdict

    mode, format_error_reward = env.reward_settings(env_name)
    return reward_from_verdict(verdict, mode, format_error_reward,
                               integrity_violation_reward=env.code.integrity_violation_reward)


# Verdicts that are a statement about the patch, the same on every run of the same spec; a timeout depends on the
# executor's load, an infrastructure failure on nothing the patch did.
_KEPT = frozenset({"completed", "not_applied", "refused"})


class VerdictCache(SingleFlight[Verdict]):
    """`env.code.verdict_cache_size` verdicts, keyed by the task spec's content (least recently used first out). A
    spec already graded is answered from here; one being graded is waited for (one run for identical answers
    in flight). Counts its hits and misses for the worker's summary."""

    def __init__(self, size: int) -> None:
        super().__init__(size, keep=lambda v: v.status in _KEPT)

    @staticmethod
    def key(spec: TaskSpec) -> str:
        return hashlib.sha256(json.dumps(dataclasses.asdict(spec), sort_keys=True).encode()).hexdigest()

    async def grade(self, spec: TaskSpec, run: Callable[[], Awaitable[Verdict]]) -> Verdict:
        return await self.get_or_run(self.key(spec), run)


class Scorer:
    """Scores completions of any registered environment; SWE answers go through the sandbox fleet (`env.code`).
    Reads only the config's `env` section."""

    def __init__(self, env: EnvConfig) -> None:
        from sandbox_client import SandboxClient

        self.env = env
        self.sandbox = SandboxClient.from_config(env.code)
        self._envs: dict[str, Any] = {}
        self.infra_retries = 0
        self.verdicts = VerdictCache(env.code.verdict_cache_size) if env.code.verdict_cache_size else None

    async def close(self) -> None:
        await self.sandbox.close()

    def _env(self, name: str) -> Any:
        if name not in self._envs:
            from envs.registry import make_environment

            self._envs[name] = make_environment(name, self.env, scorer=self._run_in_sandbox)
        return self._envs[name]

    async def _run_in_sandbox(self, spec: TaskSpec) -> Verdict:
        if self.verdicts is None:
            return await self._evaluate(spec)
        return await self.verdicts.grade(spec, lambda: self._evaluate(spec))

    async def _evaluate(self, spec: TaskSpec) -> Verdict:
        result = await self.sandbox.evaluate(spec)
        self.infra_retries += result.retries
        counter = _retries_here.get()
        if counter is not None:
            counter[0] += result.retries
        if result.infra_error is not None:
            return Verdict(status="infra_error", error=result.infra_error)
        assert result.verdict is not None
        return result.verdict

    async def prefetch(self, payload: dict[str, Any]) -> None:
        """Start pulling the task's instance image on the executors while its answers are generated. Best effort: a
        pull that fails shows up as the task's infrastructure error, naming the image."""
        image = payload.get("image")
        if isinstance(image, str) and image:
            try:
                await self.sandbox.prefetch(image)
            except Exception as exc:  # an optimisation only: the task itself still pulls what it needs
                log.debug("prefetch of %s failed: %s", image, exc)

    async def score(self, env_name: str, payload: dict[str, Any], text: str, *, truncated: bool) -> tuple[
            Verdict, float, int]:
        """(verdict, reward, infrastructure retries spent). Raises ScoringUnavailable instead of scoring an
        infrastructure failure."""
        counter = [0]
        token = _retries_here.set(counter)
        try:
            # No `cfg=`: the environments were made from `self.env`, so they hold its settings (the task timeout).
            result = await self._env(env_name).score(payload, text, truncated=truncated)
        finally:
            _retries_here.reset(token)
        if result.infra_error is not None:
            raise ScoringUnavailable(result.infra_error)
        return result.verdict, reward_for(self.env, env_name, result.verdict), counter[0]
