"""`make_engine`: the generation engine that `policy.generation.backend` names, configured from the policy's config.

The rollout worker's entry point (`rollout/server.py: serve`) composes it: `make_engine(cfg.policy, model, seed=...,
max_images_per_prompt=max_images(...))`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from rollout.engine.base import GenerationEngine

if TYPE_CHECKING:
    from fleet.config.env import ComputerUseEnvConfig
    from fleet.config.policy import PolicyConfig


class _Common(TypedDict):
    """What every engine is given alike."""

    dtype: str
    tokenizer: str | None
    max_model_len: int
    seed: int
    initial_version: int


def make_engine(policy: PolicyConfig, model_path: str | Path, *, seed: int, max_images_per_prompt: int = 0,
                initial_version: int = 0) -> GenerationEngine:
    """Build (not start) the engine. The served dtype is `policy.precision`: pushed tensors must carry that dtype.
    Context length: `policy.generation.vllm_cfg.max_model_len`, else `policy.max_total_sequence_length`. `seed`:
    `grpo.seed`; `max_images_per_prompt`: `max_images(...)` (vLLM only)."""
    g = policy.generation
    v = g.vllm_cfg
    common = _Common(dtype=policy.precision, tokenizer=policy.tokenizer.name,
                     max_model_len=v.max_model_len or policy.max_total_sequence_length, seed=seed,
                     initial_version=initial_version)
    if g.backend == "vllm":
        from rollout.engine.vllm_engine import VllmEngine

        return VllmEngine(model_path, v, **common, max_images_per_prompt=max_images_per_prompt)
    if g.backend == "hf":
        from rollout.engine.hf_batched import BatchedHfEngine
        from rollout.engine.hf_engine import HfEngine

        h = g.hf_cfg
        if h.batching == "batched":
            return BatchedHfEngine(model_path, **common, device=g.device, max_num_seqs=h.max_num_seqs,
                                   max_prefill_tokens=h.max_prefill_tokens, kv_cache_gb=h.kv_cache_gb,
                                   cuda_graphs=h.cuda_graphs, prefill_wait_steps=h.prefill_wait_steps,
                                   decode_steps=h.decode_steps)
        return HfEngine(model_path, **common, device=g.device)
    raise ValueError(f"policy.generation.backend={g.backend!r} is not an engine (expected 'vllm' or 'hf')")


def max_images(computer_use: ComputerUseEnvConfig | None) -> int:
    """Screenshots one computer-use turn's context may hold (the first one and one per action); 0 off that path
    (`computer_use`: the `env.computer_use` section when the run is on it, else None)."""
    return computer_use.max_actions + 1 if computer_use is not None else 0
