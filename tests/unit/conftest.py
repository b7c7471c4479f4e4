"""Fixtures of the unit tests that build a model (the trainer's, the weight transports'): the locally made tiny Qwen2,
small configs around it, and a snapshot of its weights with the spec a rollout worker derives from its checkpoint."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fleet.config import MasterConfig, parse_config
from fleet.contracts.weights import WeightsId
from rollout.engine.base import checkpoint_weight_spec
from trainer.dist import Dist, DistEnv
from trainer.model import build_policy
from trainer.weights import gather_snapshot


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    from workshop.resolve import resolve_model

    return resolve_model("tiny-qwen2")


@pytest.fixture
def make_cfg(tiny_model_path: str, tmp_path) -> Callable[..., MasterConfig]:  # type: ignore[no-untyped-def]
    """A small trainer config (4 prompts x 4 generations, global batch 16, micro-batch 4); overrides on top."""

    def make(*overrides: str) -> MasterConfig:
        base = [
            f"policy.model_name={tiny_model_path}", "policy.max_total_sequence_length=256",
            "policy.generation.max_new_tokens=64", "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=4", "policy.optimizer.lr=1.0e-3", "grpo.num_prompts_per_step=4",
            "grpo.num_generations_per_prompt=4", "loss_fn.reference_policy_kl_penalty=0.0",
            f"run.dir={tmp_path / 'run'}", "logger.progress_bar=false", "logger.tensorboard_enabled=false",
        ]
        return parse_config({}, [*base, *overrides])

    return make


@pytest.fixture
def snapshot_and_spec(make_cfg):  # type: ignore[no-untyped-def]
    cfg: MasterConfig = make_cfg()
    policy = build_policy(cfg.policy, cfg.policy.model_name, Dist(DistEnv(0, 1, 0), torch.device("cpu"), 60))
    snap = gather_snapshot(policy, torch.float32, keep=True, weights=WeightsId(2, 3))
    assert snap is not None
    spec, _ = checkpoint_weight_spec(cfg.policy.model_name, "float32")
    return cfg, snap, {k: (v.shape, v.dtype) for k, v in spec.items()}
