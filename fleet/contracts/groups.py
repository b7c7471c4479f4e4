"""A prompt group and what a rollout worker makes of it, as plain types: the leased `PromptGroup`, each answer's
`Trajectory` and the `ScoredGroup` the worker submits. They mirror `grpofleet.v1.PromptGroup`, `Trajectory` and
`ScoredGroup` (protos/grpofleet/v1/common.proto, whose comments are the reference) field for field; the rollout
worker's logic (the lease loop, scoring, the agent runners) and the trainer's (batches, grading, validation) work on
these, and the buffer client converts them to and from protobuf (`buffer_client/wire.py`, the one conversion point),
as the replay buffer's servicer does for its store.

Token-exact: per-token arrays (`response_token_ids`, `generation_logprobs`, `token_versions`) hold what the engine
produced, one entry per token; observation tokens (agent mode) carry version -1 and log-prob 0. A trajectory's verdict
is the sandbox contract's `Verdict`; the wire's status enum and its 500-character detail are made at the edge.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from fleet.contracts.sandbox import Verdict


@dataclass(frozen=True)
class PromptGroup:
    """One prompt, to be answered `num_generations` times (0: `grpo.num_generations_per_prompt`)."""

    group_id: str
    target_step: int = 0
    env_name: str = ""
    task_id: str = ""
    prompt_token_ids: list[int] = field(default_factory=list)
    num_generations: int = 0
    env_payload: bytes = b""
    """The environment's JSON payload for scoring."""
    enqueued_at_ms: int = 0
    validation: bool = False


@dataclass(frozen=True)
class EpisodeInfo:
    """How a multi-turn episode went (agent mode, in-process tools, computer use)."""

    turns: int
    tool_calls: int
    tool_errors: int
    end_reason: str
    generated_tokens: int
    observation_tokens: int


@dataclass(frozen=True)
class TrajectoryImage:
    """Computer use: one screenshot the model saw, and its placeholder run [start, start + length) in the response."""

    png: bytes
    start: int
    length: int
    width: int
    height: int


@dataclass
class Trajectory:
    response_token_ids: list[int]
    generation_logprobs: list[float]
    token_versions: list[int]
    reward: float
    verdict: Verdict
    finish_reason: str
    generation_s: float = 0.0
    scoring_s: float = 0.0
    observation_spans: list[tuple[int, int]] = field(default_factory=list)
    """(start, length) of each run of observation tokens; empty for single-shot answers."""
    episode: EpisodeInfo | None = None
    """None for single-shot answers (the wire leaves the field unset)."""
    images: list[TrajectoryImage] = field(default_factory=list)


@dataclass(frozen=True)
class ScoredGroup:
    """All G trajectories of one prompt group. The version range is its generated tokens' (observation tokens,
    version -1, do not age a group)."""

    prompt: PromptGroup
    trajectories: list[Trajectory]
    worker_id: str
    min_version: int
    max_version: int
    submitted_at_ms: int

    @classmethod
    def assemble(cls, prompt: PromptGroup, trajectories: Sequence[Trajectory], worker_id: str,
                 served_version: int) -> ScoredGroup:
        """The group a worker submits, stamped now. Its version range is its generated tokens' (`served_version`
        when it has none): observation tokens (agent mode) carry version -1, no weights made them."""
        versions = [v for t in trajectories for v in t.token_versions if v >= 0] or [served_version]
        return cls(prompt, list(trajectories), worker_id, min(versions), max(versions), int(time.time() * 1000))
