"""Agent-mode trajectories in the trainer: observation tokens (version -1 / observation spans) are in the packed
context but masked out of the loss (no gradient reaches them), the sample's version ignores them, and the step's
agent metrics count turns, tokens and end reasons."""

from __future__ import annotations

import torch
from trainer_groups import group, traj

from fleet.config import MasterConfig
from fleet.contracts.groups import Trajectory
from rollout.agent.episode import OBSERVATION_VERSION as ROLLOUT_OBSERVATION_VERSION
from trainer.agent_metrics import OBSERVATION_VERSION, turns
from trainer.batch import build_step_batch, loss_mask, plan_rank
from trainer.grpo import count_valid, grpo_loss

OBS = OBSERVATION_VERSION


def _agent_traj(reward: float, finish: str = "submitted") -> Trajectory:
    # turn 1 (3 tokens, v4), observation (2), turn 2 (2 tokens, v5), observation (3), turn 3 (1 token, v5)
    versions = [4, 4, 4, OBS, OBS, 5, 5, OBS, OBS, OBS, 5]
    logprobs = [-0.5 if v != OBS else 0.0 for v in versions]
    return traj(list(range(100, 111)), logprobs, versions, reward, finish, tool_calls=3, tool_errors=1)


def test_the_contract_value_is_the_same_on_both_sides() -> None:
    assert OBSERVATION_VERSION == ROLLOUT_OBSERVATION_VERSION == -1


def test_observation_tokens_are_masked_and_get_no_gradient() -> None:
    g = group("g", [1, 2, 3], [_agent_traj(1.0), _agent_traj(0.0, "max_turns")], min_version=4)
    batch = build_step_batch([g], 5, leave_one_out=False, normalize=False, max_len=64)
    s = batch.samples[0]
    assert s.version == 4, "the age comes from generated tokens only"
    assert s.loss_mask == [1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1]
    [[mb]] = plan_rank(batch, global_batch=2, micro_batch=2, rank=0, world=1, row_tokens=32, packing=True)
    assert mb.mask[0].tolist()[:11] == s.loss_mask
    tok, _ = count_valid(mb.mask)
    assert tok.item() == 2 * 6, "observation tokens do not count in the loss normaliser"
    logprobs = torch.full_like(mb.mask, -0.5, requires_grad=True)
    loss, _ = grpo_loss(logprobs, logprobs.detach(), mb.generation_logprobs, mb.advantages, mb.mask,
                        MasterConfig().loss_fn, global_valid_tokens=tok, global_valid_seqs=2,
                        reference_logprobs=logprobs.detach())
    loss.backward()
    assert logprobs.grad is not None
    grad = logprobs.grad[0, :11]
    observed = torch.tensor(s.loss_mask) == 0
    assert torch.all(grad[observed] == 0) and torch.all(grad[~observed] != 0)


def test_observation_spans_mask_too_when_versions_do_not_say_it() -> None:
    t = traj([1, 2, 3, 4], [-1.0, 0.0, 0.0, -1.0], [0, 0, 0, 0], 1.0, "submitted", observation_spans=[(1, 2)])
    assert loss_mask(t) == [1.0, 0.0, 0.0, 1.0]
    assert loss_mask(traj([1], [-1.0], [0], 1.0)) is None, "single-shot samples train every token"


def test_step_metrics_count_turns_tokens_end_reasons_and_tool_errors() -> None:
    single = traj([7, 8], [-1.0, -1.0], [4, 4], 0.0, "stop")
    g = group("g", [1], [_agent_traj(1.0), _agent_traj(0.0, "timeout"), single], min_version=4)
    stats = build_step_batch([g], 5, leave_one_out=False, normalize=False, max_len=64).stats
    assert stats["agent/episodes"] == 2 and stats["agent/turns_mean"] == 3
    assert stats["agent/generated_tokens_mean"] == 6 and stats["agent/observation_tokens_mean"] == 5
    assert stats["agent/end_submitted_frac"] == stats["agent/end_timeout_frac"] == 0.5
    assert stats["agent/tool_error_rate"] == 2 / 6
    assert turns([OBS, 1, OBS, 1, 1]) == 2
    plain = build_step_batch([group("s", [1], [single], 4)], 5, leave_one_out=False, normalize=False, max_len=8)
    assert not any(k.startswith("agent/") for k in plain.stats)
