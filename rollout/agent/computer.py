"""Computer-use episodes for the rollout worker: screenshots in, one action per turn out, graded on `done`.

The episode shape is the contract's (/work/notes/cu-contract.md): the trainer's prompt is text only (system prompt,
the action tools through the chat template, the task's instruction); the runner opens a sandbox computer session
for the task's payload, and the page's first screenshot is the first observation, before the first generation.
Then each turn: generate, parse one tool call (`envs/agent/parser.py` extracts it, the environment's
`parse_action` validates it), send it, and append the new screenshot as an observation; a bad call gets an error
observation (text, no screenshot: the page did not change). `done` ends the episode and `finish` grades the page.

The loop is agent mode's (`run_episode`): token-exact trajectories, observation tokens masked from the loss, the
same budgets (`env.code.agent`, turns capped at `env.computer_use.max_actions` + 1). `VisionChatFormat` renders an
observation's screenshot with the chat template (Qwen2-VL: `<|vision_start|><|image_pad|><|vision_end|>`) and
expands its placeholder to the image's N tokens; the trajectory carries each screenshot's PNG bytes and the span of
its placeholder run, and every generation gets the images of its whole context. A sandbox failure (a crashed or
hung renderer, an executor gone) raises `ScoringUnavailable`: the group goes back, never a zero reward.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from envs.agent.chat import ChatFormat
from envs.agent.parser import ToolCall
from envs.agent.tools import Observation
from envs.computer_use.actions import ActionError, Done, parse_action
from fleet.contracts.groups import PromptGroup, Trajectory, TrajectoryImage
from fleet.contracts.sandbox import Verdict
from rollout.agent.episode import Episode, run_episode
from rollout.agent.runner import _trajectory, limits_from_config
from rollout.engine.base import SamplingSpec
from rollout.scoring import ScoringUnavailable, reward_for
from sandbox_client.computer import ActionRejected, ComputerClient, ComputerSession, ComputerVerdict
from sandbox_client.results import SandboxUnavailable
from workshop.vision import ImageCodec

if TYPE_CHECKING:
    from fleet.config.env import EnvConfig
    from fleet.config.policy import PolicyConfig
    from rollout.engine.base import GenerationEngine

COMPUTER_ENVS = frozenset({"computer_use"})


class VisionChatFormat(ChatFormat):
    """`ChatFormat` whose observations may carry a screenshot, rendered by the template and expanded to its tokens."""

    def __init__(self, processor: Any) -> None:
        self.codec = ImageCodec(processor)
        super().__init__(self.codec.tokenizer)

    def observation_tokens(self, results: Sequence[Observation], max_tokens: int, *,
                           turn_closed: bool) -> tuple[list[int], list[tuple[bytes, int, int]]]:
        contents: list[list[dict[str, Any]]] = []
        for r in results:
            text = [{"type": "text", "text": self.truncate(r.text, max_tokens)}] if r.text else []
            parts: list[dict[str, Any]] = text
            contents.append([*parts, {"type": "image"}] if r.image is not None else parts)
        ids = self.observation_ids(contents, turn_closed=turn_closed)
        shots = iter([r for r in results if r.image is not None])
        pad = self.codec.image_token_id
        out: list[int] = []
        images: list[tuple[bytes, int, int]] = []
        for t in ids:
            if t != pad:
                out.append(t)
                continue
            shot = next(shots)  # the template renders one placeholder per image part, in order
            assert shot.image is not None
            n = self.codec.num_tokens(*shot.size)
            images.append((shot.image, len(out), n))
            out += [pad] * n
        return out, images


class ComputerTools:
    """The actions of one episode, sent to its sandbox session; one per turn (the contract's episode shape)."""

    max_calls_per_turn = 1

    def __init__(self, session: ComputerSession, viewport: tuple[int, int]) -> None:
        self.session, self.viewport = session, viewport
        self.action_latencies: list[float] = []

    async def run(self, call: ToolCall) -> Observation:
        try:
            action = parse_action(call.name, call.arguments, viewport=self.viewport)
        except ActionError as exc:
            return Observation(f"error: {exc}", error=True)
        if isinstance(action, Done):
            return Observation("", submitted=True)
        try:
            shot = await self.session.act(action)
        except ActionRejected as exc:
            return Observation(f"error: {exc}", error=True)
        self.action_latencies.append(shot.elapsed_s)
        return Observation("", image=shot.png, size=(shot.width, shot.height))


def _verdict(v: ComputerVerdict) -> Verdict:
    """The sandbox's page check as a verdict the one reward mapping (`reward_for`) scores: passed = FULL."""
    return Verdict(status="completed", patch_applied=True, tests_passed=int(v.passed), tests_failed=int(not v.passed),
                   resolution="FULL" if v.passed else "NO", error=v.detail[:500])


class ComputerRunner:
    """Reads `env` (the sandbox, agent budgets, `computer_use`, reward settings) and `policy` (what bounds the
    budgets, the image bytes per trajectory); `rollout/server.py` hands it both."""

    def __init__(self, env: EnvConfig, policy: PolicyConfig, engine: GenerationEngine, processor: Any,
                 owner: str) -> None:
        self.env, self.engine = env, engine
        self.fmt = VisionChatFormat(processor)
        # One owner per process, as agent mode: a restarted worker of the same id must not keep old sessions alive.
        self.client = ComputerClient.from_config(env.code, f"{owner}/{uuid.uuid4().hex[:12]}")
        self.limits = replace(limits_from_config(env.code.agent, policy), max_turns=env.computer_use.max_actions + 1,
                              max_image_bytes=policy.vision.max_image_bytes_per_trajectory)
        self.end_reasons: Counter[str] = Counter()
        self.tool_calls = self.tool_errors = self.actions = 0
        self.action_s = 0.0

    @staticmethod
    def handles(env_name: str) -> bool:
        return env_name in COMPUTER_ENVS

    async def close(self) -> None:
        await self.client.close()

    def summary(self) -> dict[str, Any]:
        return {"episodes": sum(self.end_reasons.values()), "end_reasons": dict(self.end_reasons),
                "tool_calls": self.tool_calls, "tool_errors": self.tool_errors, "actions": self.actions,
                "action_s_mean": self.action_s / max(1, self.actions)}

    async def sample(self, prompt: PromptGroup, payload: dict[str, Any], sampling: SamplingSpec,
                     index: int) -> Trajectory:
        t0 = time.monotonic()
        viewport = (int(payload["viewport"][0]), int(payload["viewport"][1]))
        try:
            session = await self.client.open(payload)
            try:
                tools = ComputerTools(session, viewport)
                first = Observation("", image=session.first.png, size=(session.first.width, session.first.height))
                episode = await run_episode(self.engine.generate, self.fmt, tools, prompt.prompt_token_ids,
                                            sampling, self.limits, f"{prompt.group_id}/{index}/{time.monotonic_ns()}",
                                            first=first)
                t1 = time.monotonic()
                verdict = _verdict(await session.finish())
            finally:
                await session.close()
        except SandboxUnavailable as exc:  # 400/401 (a configuration bug) propagate: the worker logs them loudly
            raise ScoringUnavailable(f"sandbox computer session failed during an episode: {exc}") from exc
        if episode.turns == 0 and episode.end_reason == "timeout":
            raise ScoringUnavailable("the episode timed out before its first turn ended (env.code.agent."
                                     "episode_timeout_s is too short for this engine)")
        if episode.turns == 0:  # a configuration too small for the task: loud, never a zero reward
            raise ValueError(f"group {prompt.group_id}: the prompt and the first screenshot leave no room for a "
                             f"turn ({episode.end_reason}, {len(prompt.prompt_token_ids)}"
                             f" + {len(episode.token_ids)} tokens): raise policy.max_total_sequence_length")
        self._count(episode, tools)
        traj = _trajectory(episode, verdict, reward_for(self.env, prompt.env_name, verdict), t1 - t0,
                           time.monotonic() - t1)
        traj.images = [TrajectoryImage(png, s, n, viewport[0], viewport[1]) for png, s, n in episode.images]
        return traj

    def _count(self, episode: Episode, tools: ComputerTools) -> None:
        self.end_reasons[episode.end_reason] += 1
        self.tool_calls += episode.tool_calls
        self.tool_errors += episode.tool_errors
        self.actions += len(tools.action_latencies)
        self.action_s += sum(tools.action_latencies)
