"""A checkpoint restores step, weight version, data position, RNG, scheduler and optimizer exactly, loads as an HF
model, is written atomically, and keeps the best `keep_top_k`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from fleet.config.loader import dump_config
from fleet.contracts.weights import WeightsId
from trainer.batch import build_step_batch
from trainer.checkpoint import CheckpointManager, TrainerCheckpoint
from trainer.data import ListSource, PromptFeeder, Task
from trainer.dist import Dist, DistEnv
from trainer.model import build_policy, iter_full_state
from trainer.step import StepRunner, make_optimizer


def _single() -> Dist:
    return Dist(DistEnv(0, 1, 0), torch.device("cpu"), timeout_s=60)


def _trained(cfg):  # type: ignore[no-untyped-def]
    from test_trainer_step import synthetic_groups

    dist = _single()
    policy = build_policy(cfg.policy, cfg.policy.model_name, dist)
    opt, sched = make_optimizer(policy, cfg.policy.optimizer)
    runner = StepRunner(cfg.policy, cfg.grpo, cfg.loss_fn, dist, policy, None, opt, sched)
    batch = build_step_batch(synthetic_groups(1), 0, leave_one_out=True, normalize=True, max_len=256)
    runner.run(batch)
    return dist, policy, opt, sched


def test_round_trip_is_exact(make_cfg, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = make_cfg("policy.optimizer.warmup_steps=5")
    dist, policy, opt, sched = _trained(cfg)
    feeder = PromptFeeder(ListSource([Task("arith", f"t{i}", [1, 2, i + 3], b"{}") for i in range(10)]),
                          num_prompts=4, num_generations=4, seed=7)
    for step in range(3):
        feeder.next_share(step)
    feeder.mark_trained(0)
    mgr = CheckpointManager(cfg.checkpointing, tmp_path / "ckpt", dist, cfg.policy.model_name,
                            resolved_config=dump_config(cfg))
    random.seed(123)
    torch.manual_seed(456)
    state = TrainerCheckpoint(step=1, epoch=3, data_position=feeder.state(),
                              scheduler=sched.state_dict(), metrics={"reward/mean": 0.5})
    path = mgr.save(policy, opt, state)
    expected_rng = (random.random(), torch.rand(3))
    assert path.name == "step_00000001" and not list((tmp_path / "ckpt").glob(".tmp-*"))

    # A fresh process' view: new model from the checkpoint's HF folder, new optimizer, scrambled RNG.
    random.seed(999)
    torch.manual_seed(999)
    policy2 = build_policy(cfg.policy, str(path / "model"), dist)
    opt2, sched2 = make_optimizer(policy2, cfg.policy.optimizer)
    loaded = mgr.load(mgr.latest() or path, policy2, opt2)
    sched2.load_state_dict(loaded.scheduler)
    assert (random.random(), *torch.rand(3).tolist()) == (expected_rng[0], *expected_rng[1].tolist())
    assert (loaded.step, loaded.weights, loaded.epoch) == (1, WeightsId(3, 1), 3)
    assert loaded.data_position == feeder.state()
    assert loaded.data_position["next_step"] == 3 and loaded.data_position["cursor"] == 12
    assert loaded.data_position["enqueued"] == {"1": [[4, 4]], "2": [[8, 4]]}
    assert sched2.state_dict() == sched.state_dict()
    a, b = dict(iter_full_state(policy)), dict(iter_full_state(policy2))
    assert all(torch.equal(a[k], b[k]) for k in a)
    for p, q in zip(policy.parameters(), policy2.parameters(), strict=True):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][key], opt2.state[q][key]), key
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


def test_checkpoint_is_hf_loadable(make_cfg, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import AutoModelForCausalLM

    from fleet.tokenizer import load_tokenizer

    cfg = make_cfg()
    dist, policy, opt, _ = _trained(cfg)
    mgr = CheckpointManager(cfg.checkpointing, tmp_path, dist, cfg.policy.model_name, resolved_config=dump_config(cfg))
    path = mgr.save(policy, opt, TrainerCheckpoint(step=4))
    hf = AutoModelForCausalLM.from_pretrained(path / "model")
    load_tokenizer(path / "model")
    ours = dict(iter_full_state(policy))
    for name, t in hf.state_dict().items():
        if name in ours:
            assert torch.equal(t, ours[name]), name
    assert json.loads((path / "trainer.json").read_text())["step"] == 4


def test_keep_top_k_keeps_best_and_latest(make_cfg, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = make_cfg("checkpointing.keep_top_k=2", "checkpointing.metric_name=val/accuracy")
    dist, policy, opt, _ = _trained(cfg)
    mgr = CheckpointManager(cfg.checkpointing, tmp_path, dist, None, resolved_config=dump_config(cfg))
    for step, acc in [(1, 0.9), (2, 0.1), (3, 0.2)]:
        mgr.save(policy, opt, TrainerCheckpoint(step=step, metrics={"val/accuracy": acc}))
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_00000001", "step_00000003"]
    assert mgr.latest() == tmp_path / "step_00000003"


def test_a_checkpoint_of_the_old_format_with_weight_version_still_loads(make_cfg, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cfg = make_cfg()
    dist, policy, opt, _ = _trained(cfg)
    mgr = CheckpointManager(cfg.checkpointing, tmp_path, dist, None, resolved_config=dump_config(cfg))
    path = mgr.save(policy, opt, TrainerCheckpoint(step=2, epoch=1))
    written = json.loads((path / "trainer.json").read_text())
    assert "weight_version" not in written  # one identity: the version is the step
    (path / "trainer.json").write_text(json.dumps({**written, "weight_version": 2}))  # as trainers before wrote it
    loaded = mgr.load(path, policy, opt)
    assert (loaded.step, loaded.weights) == (2, WeightsId(1, 2))
    (path / "trainer.json").write_text(json.dumps({**written, "weight_version": 5}))
    with pytest.raises(ValueError, match="weight_version 5 differs from step 2"):
        mgr.load(path, policy, opt)
