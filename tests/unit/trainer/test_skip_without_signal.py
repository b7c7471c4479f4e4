"""`grpo.skip_update_without_signal`: a step in which no group has reward spread leaves the weights alone, while
the default (NeMo RL's behaviour) lets AdamW move them by its momentum."""

from __future__ import annotations

import torch
from test_trainer_step import make_batch, single, synthetic_groups

from fleet.contracts.groups import ScoredGroup
from trainer.batch import build_step_batch
from trainer.model import build_policy, iter_full_state
from trainer.step import StepRunner, make_optimizer


def _flat(groups: list[ScoredGroup]) -> list[ScoredGroup]:
    for g in groups:
        for t in g.trajectories:
            t.reward = 1.0  # one reward per group: every advantage is exactly 0
    return groups


def _steps(cfg, batches):  # type: ignore[no-untyped-def]
    policy = build_policy(cfg.policy, cfg.policy.model_name, single())
    opt, sched = make_optimizer(policy, cfg.policy.optimizer)
    runner = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, single(), policy, None, opt, sched)
    snaps, metrics = [], []
    for b in batches:
        metrics.append(runner.run(b))
        snaps.append({n: t.detach().clone() for n, t in iter_full_state(policy)})
    return snaps, metrics


def _moved(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_step_without_reward_spread_makes_no_update_when_asked(make_cfg) -> None:  # type: ignore[no-untyped-def]
    for skip in (True, False):
        cfg = make_cfg(f"grpo.skip_update_without_signal={str(skip).lower()}")
        flat = build_step_batch(_flat(synthetic_groups(1)), 1, leave_one_out=False, normalize=True,
                                max_len=cfg.policy.max_total_sequence_length)
        assert all(s.advantage == 0.0 for s in flat.samples)
        (after_signal, after_flat), (m_signal, m_flat) = _steps(cfg, [make_batch(cfg), flat])
        assert m_signal["train/skipped_no_signal"] == 0.0
        if skip:
            assert m_flat["train/skipped_no_signal"] == 1.0 and m_flat["train/optimizer_updates"] == 0.0
            assert _moved(after_signal, after_flat) == 0.0
        else:  # the zero gradient still moves the weights: momentum from the first step
            assert _moved(after_signal, after_flat) > 1e-5


def test_no_skip_when_a_kl_term_gives_a_gradient(make_cfg) -> None:  # type: ignore[no-untyped-def]
    cfg = make_cfg("grpo.skip_update_without_signal=true", "loss_fn.reference_policy_kl_penalty=0.01")
    policy = build_policy(cfg.policy, cfg.policy.model_name, single())
    reference = build_policy(cfg.policy, cfg.policy.model_name, single())
    opt, sched = make_optimizer(policy, cfg.policy.optimizer)
    runner = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, single(), policy, reference, opt, sched)
    flat = build_step_batch(_flat(synthetic_groups(2)), 0, leave_one_out=False, normalize=True,
                            max_len=cfg.policy.max_total_sequence_length)
    assert runner.run(flat)["train/skipped_no_signal"] == 0.0
