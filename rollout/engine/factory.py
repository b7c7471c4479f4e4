"""`make_engine`: the generation engine that `policy.generation.backend` names, configured from the config tree."""

from __future__ import annotations

from pathlib import Path

from fleet.config import MasterConfig
from rollout.engine.base import GenerationEngine


def make_engine(cfg: MasterConfig, model_path: str | Path, *, initial_version: int = 0) -> GenerationEngine:
    """Build (not start) the engine. The served dtype is `policy.precision`: pushed tensors must carry that dtype.
    Context length: `policy.generation.vllm_cfg.max_model_len`, else `policy.max_total_sequence_length`."""
    g = cfg.policy.generation
    v = g.vllm_cfg
    common = dict(
        dtype=cfg.policy.precision,
        tokenizer=cfg.policy.tokenizer.name,
        max_model_len=v.max_model_len or cfg.policy.max_total_sequence_length,
        seed=cfg.grpo.seed,
        initial_version=initial_version,
    )
    if g.backend == "vllm":
        from rollout.engine.vllm_engine import VllmEngine

        return VllmEngine(model_path, v, dtype=cfg.policy.precision, tokenizer=cfg.policy.tokenizer.name,
                          max_model_len=v.max_model_len or cfg.policy.max_total_sequence_length, seed=cfg.grpo.seed,
                          initial_version=initial_version, max_images_per_prompt=max_images(cfg))
    if g.backend == "hf":
        from rollout.engine.hf_engine import HfEngine

        return HfEngine(model_path, device=g.device, **common)  # type: ignore[arg-type]
    raise ValueError(f"policy.generation.backend={g.backend!r} is not an engine (expected 'vllm' or 'hf')")


def max_images(cfg: MasterConfig) -> int:
    """Screenshots one computer-use turn's context may hold (the first one and one per action); 0 off that path."""
    from fleet.config.vision import uses_computer_use

    return cfg.env.computer_use.max_actions + 1 if uses_computer_use(cfg) else 0
