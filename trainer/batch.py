"""Scored groups -> one step's training samples -> this rank's optimizer minibatches of packed micro-batches.

Rank 0 turns the sampled groups into a `StepBatch` (advantages per group via `trainer.grpo.compute_advantages`)
and broadcasts it; every rank then calls `plan_rank()` on the same batch, which is deterministic, so each rank takes
its own share without further communication:

* the step's samples split, in order, into minibatches of `policy.train_global_batch_size` (one optimizer update
  each; old log-probs are computed once, before the first update, as GRPO/PPO prescribes);
* a minibatch's samples are spread over the data-parallel ranks longest-first in a snake order (equal counts +-1,
  balanced tokens); with `policy.prefix_sharing`, a group's answers stay together instead (so that they share
  their prompt, `trainer.logprobs.pack`), whole groups dealt to the rank with the fewest tokens;
* a rank's share is cut into the same number of micro-batches on every rank (FSDP2 collectives must pair up;
  a rank with fewer samples gets an empty micro-batch, run as a zero-weight dummy), similar lengths together.

The loss normalisers are the minibatch's valid tokens/sequences over all ranks (all-reduced in trainer.step), so
DP x micro-batching computes exactly the loss of one big batch.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from fleet.contracts.groups import ScoredGroup, Trajectory
from trainer.agent_metrics import OBSERVATION_VERSION, agent_stats
from trainer.grading import OUTCOMES, outcome
from trainer.grpo import compute_advantages
from trainer.logprobs import PackedInputs, pack

log = logging.getLogger(__name__)

def loss_mask(traj: Trajectory) -> list[float] | None:
    """1.0 on generated tokens, 0.0 on observation tokens (version -1 or inside an observation span); None when
    every token was generated (single-shot)."""
    observed = {i for i, v in enumerate(traj.token_versions) if v == OBSERVATION_VERSION}
    for start, n in traj.observation_spans:
        observed.update(range(start, start + n))
    if not observed:
        return None
    return [0.0 if i in observed else 1.0 for i in range(len(traj.response_token_ids))]


@dataclass
class TrainSample:
    group_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    generation_logprobs: list[float]
    advantage: float
    reward: float
    version: int  # oldest weight version among the sample's generated tokens
    valid: bool = True  # False: a contract violation (logprob count != token count); masked out, counted
    loss_mask: list[float] | None = None  # agent mode: 0 on observation tokens; None: every token trained
    images: list[bytes] = field(default_factory=list)  # computer use: the screenshots, in placeholder order

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


@dataclass
class StepBatch:
    step: int
    samples: list[TrainSample]
    group_ids: list[str]
    stats: dict[str, float] = field(default_factory=dict)
    ages: list[int] = field(default_factory=list)  # per group: step - min_version
    # Per group, for the step's record in trained_groups.jsonl: which task it answered, its mean reward, and how
    # many of its answers resolved the task (FULL): whether learning spreads over tasks or repeats a few; and its
    # slowest answer's scoring time (a sync step waits for it): which tasks hold the steps.
    group_tasks: list[str] = field(default_factory=list)
    group_rewards: list[float] = field(default_factory=list)
    group_resolved: list[int] = field(default_factory=list)
    group_scoring_s_max: list[float] = field(default_factory=list)


def _clip(group: ScoredGroup, traj: Trajectory, max_len: int) -> tuple[list[int], list[float], bool]:
    keep = max(0, max_len - len(group.prompt.prompt_token_ids))
    for im in traj.images:  # never cut through an image's placeholder run: cut before it
        if im.start < keep < im.start + im.length:
            keep = im.start
    valid = len(traj.generation_logprobs) == len(traj.response_token_ids)
    if not valid:
        log.error("group %s: %d generation logprobs for %d response tokens; sample masked out",
                  group.prompt.group_id, len(traj.generation_logprobs), len(traj.response_token_ids))
    return traj.response_token_ids[:keep], list(traj.generation_logprobs[:keep]), valid


def build_step_batch(groups: list[ScoredGroup], step: int, *, leave_one_out: bool, normalize: bool,
                     max_len: int) -> StepBatch:
    """Advantages per group; samples clipped to `policy.max_total_sequence_length` (never expected: workers cap)."""
    samples: list[TrainSample] = []
    rewards_all: list[float] = []
    adv_all: list[float] = []
    clipped = zero_std = 0
    for g in groups:
        rewards = torch.tensor([[t.reward for t in g.trajectories]], dtype=torch.float64)
        adv = compute_advantages(rewards, leave_one_out=leave_one_out, normalize=normalize)[0].tolist()
        zero_std += int(bool((rewards == rewards[0, 0]).all()))
        for t, a in zip(g.trajectories, adv, strict=True):
            resp, gen_lp, valid = _clip(g, t, max_len)
            clipped += int(len(resp) < len(t.response_token_ids))
            generated = [v for v in t.token_versions if v != OBSERVATION_VERSION]
            version = min(generated) if generated else g.min_version
            mask = loss_mask(t)
            images = [im.png for im in t.images if im.start + im.length <= len(resp)]
            samples.append(TrainSample(g.prompt.group_id, list(g.prompt.prompt_token_ids), list(resp), gen_lp, float(a),
                                       float(t.reward), version, valid, mask[: len(resp)] if mask else None, images))
            rewards_all.append(float(t.reward))
            adv_all.append(float(a))
    r = torch.tensor(rewards_all or [0.0], dtype=torch.float64)
    a = torch.tensor(adv_all or [0.0], dtype=torch.float64)
    lengths = torch.tensor([len(s.response_ids) for s in samples] or [0], dtype=torch.float64)
    stats = {
        "reward/mean": r.mean().item(), "reward/std": r.std().item() if r.numel() > 1 else 0.0,
        "reward/max": r.max().item(), "reward/min": r.min().item(),
        "reward/resolved_frac": sum(t.verdict.resolution == "FULL" for g in groups for t in g.trajectories)
        / max(1, len(samples)),
        "advantage/mean": a.mean().item(), "advantage/std": a.std().item() if a.numel() > 1 else 0.0,
        "advantage/abs_max": a.abs().max().item(),
        "data/groups": float(len(groups)), "data/samples": float(len(samples)),
        "data/zero_std_groups_frac": zero_std / max(1, len(groups)),
        "data/response_len_mean": lengths.mean().item(), "data/response_len_max": lengths.max().item(),
        "data/clipped_samples": float(clipped), "data/invalid_samples": float(sum(not s.valid for s in samples)),
        "data/truncated_frac": sum(t.finish_reason == "length" for g in groups for t in g.trajectories)
        / max(1, len(samples)),
        **agent_stats([t for g in groups for t in g.trajectories]),
        **_image_stats(groups),
        **_rollout_stats(groups),
    }
    ages = [step - g.min_version for g in groups]
    return StepBatch(step, samples, [g.prompt.group_id for g in groups], stats, ages,
                     group_tasks=[g.prompt.task_id for g in groups],
                     group_rewards=[sum(t.reward for t in g.trajectories) / max(1, len(g.trajectories))
                                    for g in groups],
                     group_resolved=[sum(t.verdict.resolution == "FULL" for t in g.trajectories) for g in groups],
                     group_scoring_s_max=[max((t.scoring_s for t in g.trajectories), default=0.0) for g in groups])


def _rollout_stats(groups: list[ScoredGroup]) -> dict[str, float]:
    """`outcome/*`: the share of the step's answers per verdict kind (they sum to 1); `rollout/*`: how long the
    answers took to generate and to score (per answer, mean and max over the step)."""
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {}
    counts = Counter(outcome(t.verdict) for t in trajs)
    return {**{f"outcome/{k}": counts[k] / len(trajs) for k in OUTCOMES}, **answer_times(trajs, "rollout")}


def answer_times(trajs: list[Trajectory], prefix: str) -> dict[str, float]:
    """`<prefix>/generation_s_*` and `<prefix>/scoring_s_*`: how long the answers took to generate and to score
    (mean and max; none for no answers)."""
    if not trajs:
        return {}
    gen, score = [t.generation_s for t in trajs], [t.scoring_s for t in trajs]
    return {f"{prefix}/generation_s_mean": sum(gen) / len(gen), f"{prefix}/generation_s_max": max(gen),
            f"{prefix}/scoring_s_mean": sum(score) / len(score), f"{prefix}/scoring_s_max": max(score)}


def _image_stats(groups: list[ScoredGroup]) -> dict[str, float]:
    """Computer use: screenshots and their PNG bytes in the step (what crossed the replay buffer inline)."""
    images = [im for g in groups for t in g.trajectories for im in t.images]
    if not images:
        return {}
    return {"vision/images": float(len(images)), "vision/image_bytes": float(sum(len(im.png) for im in images)),
            "vision/image_tokens": float(sum(im.length for im in images))}


@dataclass
class MicroBatch:
    packed: PackedInputs
    generation_logprobs: torch.Tensor  # [B, T]
    mask: torch.Tensor  # [B, T] float, 1 on trained tokens
    advantages: torch.Tensor  # [B]
    tokens: int  # real (prompt + response) tokens, for throughput
    dummy: bool = False  # an empty share of a rank, run for the collectives only
    old_logprobs: torch.Tensor | None = None
    reference_logprobs: torch.Tensor | None = None


def _snake(order: list[int], world: int) -> list[list[int]]:
    shares: list[list[int]] = [[] for _ in range(world)]
    for k, idx in enumerate(order):
        lap, pos = divmod(k, world)
        shares[pos if lap % 2 == 0 else world - 1 - pos].append(idx)
    return shares


def make_micro_batch(samples: list[TrainSample], *, row_tokens: int, packing: bool,
                     pad_multiple: int = 1, share_prefixes: bool = False) -> MicroBatch:
    dummy = not samples
    if dummy:  # one token of prompt, one of response, weight 0: keeps FSDP2's collectives paired across ranks
        samples = [TrainSample("", [0], [0], [0.0], 0.0, 0.0, 0, valid=False)]
    images = tuple(png for s in samples for png in s.images)
    # One sample per row when there are images: Qwen2-VL computes M-RoPE positions over a row as one sequence.
    packed = pack([s.prompt_ids for s in samples], [s.response_ids for s in samples], row_tokens=row_tokens,
                  packing=packing and not images, pad_multiple=pad_multiple,
                  share_prefixes=share_prefixes and not images)
    if images:
        packed = replace(packed, images=images)
    b, t = len(samples), packed.max_response
    gen = torch.zeros(b, t)
    mask = torch.zeros(b, t)
    for i, s in enumerate(samples):
        n = len(s.response_ids)
        gen[i, :n] = torch.tensor(s.generation_logprobs[:n], dtype=torch.float32)
        mask[i, :n] = float(s.valid)
        if s.loss_mask is not None:  # observation tokens: in the context, never in the loss
            mask[i, :n] *= torch.tensor(s.loss_mask[:n], dtype=torch.float32)
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    return MicroBatch(packed, gen, mask, adv, 0 if dummy else sum(s.length for s in samples), dummy)


def plan_rank(batch: StepBatch, *, global_batch: int, micro_batch: int, rank: int, world: int,
              row_tokens: int, packing: bool, pad_multiple: int = 1,
              share_prefixes: bool = False) -> list[list[MicroBatch]]:
    """This rank's micro-batches, grouped by optimizer minibatch (see the module docstring)."""
    samples = batch.samples
    plan: list[list[MicroBatch]] = []
    for start in range(0, len(samples), global_batch):
        idx = list(range(start, min(start + global_batch, len(samples))))
        if share_prefixes:
            share = _prompt_shares(samples, idx, world, micro_batch)
            mine = share[rank]
        else:
            share = _snake(sorted(idx, key=lambda i: (-samples[i].length, i)), world)
            mine = sorted(share[rank], key=lambda i: (-samples[i].length, i))
        per_rank = max(len(s) for s in share)
        n_micro = max(1, -(-per_rank // micro_batch))
        cuts = [mine[k * micro_batch : (k + 1) * micro_batch] for k in range(n_micro)]
        plan.append([make_micro_batch([samples[i] for i in c], row_tokens=row_tokens, packing=packing,
                                      pad_multiple=pad_multiple, share_prefixes=share_prefixes) for c in cuts])
    return plan


def _prompt_shares(samples: list[TrainSample], idx: list[int], world: int, micro_batch: int) -> list[list[int]]:
    """Prefix sharing: each rank's samples, kept together by prompt (a group's answers, cut into pieces of at most
    `micro_batch`), the pieces dealt longest-first to the rank with the fewest tokens so far."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i in idx:
        by_prompt.setdefault(tuple(samples[i].prompt_ids), []).append(i)
    pieces = [m[k : k + micro_batch] for m in by_prompt.values() for k in range(0, len(m), micro_batch)]
    pieces.sort(key=lambda piece: (-sum(samples[i].length for i in piece), piece[0]))
    shares: list[list[int]] = [[] for _ in range(world)]
    tokens = [0] * world
    for piece in pieces:
        r = min(range(world), key=lambda k: (tokens[k], k))
        shares[r].extend(piece)
        tokens[r] += sum(samples[i].length for i in piece)
    return shares
