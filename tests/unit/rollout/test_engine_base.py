"""Engine pieces that need no running engine: weight validation, version spans, sampling, the factory."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fleet.config import parse_config
from rollout.engine import (
    SamplingSpec,
    TensorSpec,
    WeightMismatchError,
    checkpoint_weight_spec,
    make_engine,
    validate_weights,
)
from rollout.engine.base import spans_to_versions
from rollout.engine.hf_batched import BatchedHfEngine
from rollout.engine.hf_engine import HfEngine, sample_next
from rollout.engine.vllm_engine import VllmEngine
from workshop.tinymodel import ensure_tiny_model

SPEC = {"a.weight": TensorSpec((2, 3), "float32"), "b.bias": TensorSpec((3,), "float32")}
GOOD = {"a.weight": torch.zeros(2, 3), "b.bias": torch.zeros(3)}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("m") / "tiny-qwen2")


def test_validate_accepts_a_complete_set_from_mapping_or_pairs() -> None:
    assert [n for n, _ in validate_weights(SPEC, GOOD)] == ["a.weight", "b.bias"]
    assert [n for n, _ in validate_weights(SPEC, iter(GOOD.items()))] == ["a.weight", "b.bias"]


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ({"a.weight": torch.zeros(2, 3)}, "lacks 1 .* 'b.bias'"),
        ({**GOOD, "c.weight": torch.zeros(1)}, "'c.weight' is not a parameter"),
        ({**GOOD, "a.weight": torch.zeros(3, 2)}, r"'a.weight': shape \[3, 2\] != model's \[2, 3\]"),
        ({**GOOD, "b.bias": torch.zeros(3, dtype=torch.bfloat16)}, "'b.bias': dtype bfloat16 != model's float32"),
        ([("a.weight", torch.zeros(2, 3)), ("a.weight", torch.zeros(2, 3))], "'a.weight' appears twice"),
    ],
    ids=["missing", "unknown", "shape", "dtype", "duplicate"],
)
def test_validate_names_the_first_bad_tensor(tensors: object, message: str) -> None:
    with pytest.raises(WeightMismatchError, match=message):
        validate_weights(SPEC, tensors)  # type: ignore[arg-type]


def test_tied_head_alias_is_dropped() -> None:
    out = validate_weights(SPEC, {**GOOD, "lm_head.weight": torch.zeros(9)}, {"lm_head.weight"})
    assert [n for n, _ in out] == ["a.weight", "b.bias"]


def test_checkpoint_spec_reads_headers_with_served_dtype(tiny_model: Path) -> None:
    spec, aliases = checkpoint_weight_spec(tiny_model, "bfloat16")
    assert spec["model.embed_tokens.weight"] == TensorSpec((2048, 256), "bfloat16")
    assert spec["model.layers.0.self_attn.k_proj.weight"].shape == (128, 256)  # 2 KV heads x head_dim 64
    assert "lm_head.weight" not in spec and aliases == {"lm_head.weight"}
    assert len(spec) == 1 + 4 * 12 + 1


def test_spans_to_versions() -> None:
    span = SimpleNamespace
    assert spans_to_versions([span(version="3", start=0, end=2), span(version="4", start=2, end=5)], 5) == [
        3, 3, 4, 4, 4
    ]  # fmt: skip
    assert spans_to_versions(None, 0) == []
    with pytest.raises(RuntimeError, match="no weight-version labels"):
        spans_to_versions(None, 3)
    with pytest.raises(RuntimeError, match="cover 2 of 3"):
        spans_to_versions([span(version="1", start=0, end=2)], 3)


def test_sample_next_returns_raw_logprob_whatever_the_sampling() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, -1.0])
    raw = torch.log_softmax(logits, -1)
    assert sample_next(logits, SamplingSpec(temperature=0), None) == (0, pytest.approx(float(raw[0])))
    gen = torch.Generator().manual_seed(0)
    for spec in [SamplingSpec(temperature=0.3, top_k=1), SamplingSpec(temperature=2.0, top_p=0.01)]:
        assert sample_next(logits, spec, gen) == (0, pytest.approx(float(raw[0])))
    seen = {sample_next(logits, SamplingSpec(temperature=5.0, top_k=2), gen)[0] for _ in range(200)}
    assert seen == {0, 1}
    tok, lp = sample_next(logits, SamplingSpec(temperature=5.0), gen)
    assert lp == pytest.approx(float(raw[tok]))  # not the tempered log-prob


def test_sampling_spec_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        SamplingSpec(max_new_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingSpec(top_p=0)


def test_make_engine_follows_backend_and_config(tiny_model: Path) -> None:
    cfg = parse_config({}, ["policy.generation.backend=hf", "policy.max_total_sequence_length=777", "grpo.seed=5"])
    eng = make_engine(cfg.policy, tiny_model, seed=cfg.grpo.seed)
    assert isinstance(eng, BatchedHfEngine) and eng.max_model_len == 777 and eng.dtype == "float32"
    assert eng.max_num_seqs == 256 and eng.max_prefill_tokens == 16384
    cfg = parse_config({}, ["policy.generation.backend=hf", "policy.generation.hf_cfg.batching=sequential",
                            "policy.generation.hf_cfg.max_num_seqs=3"])
    eng = make_engine(cfg.policy, tiny_model, seed=cfg.grpo.seed)
    assert type(eng) is HfEngine
    cfg = parse_config({}, ["policy.generation.backend=hf", "policy.generation.hf_cfg.max_num_seqs=3",
                            "policy.generation.hf_cfg.kv_cache_gb=0.5", "policy.generation.hf_cfg.cuda_graphs=false"])
    eng = make_engine(cfg.policy, tiny_model, seed=cfg.grpo.seed)
    assert isinstance(eng, BatchedHfEngine) and eng.max_num_seqs == 3 and eng._kv_cache_gb == 0.5
    assert not eng._want_graphs
    cfg = parse_config({}, ["policy.generation.vllm_cfg.max_model_len=256", "policy.precision=bfloat16",
                            "policy.generation.vllm_cfg.cpu_weight_layout=plain",
                            "policy.generation.vllm_cfg.staging_dir=null"])
    eng = make_engine(cfg.policy, tiny_model, seed=cfg.grpo.seed, initial_version=3)
    assert isinstance(eng, VllmEngine) and eng.max_model_len == 256 and eng.served_version == 3
    assert eng._cpu_weight_layout == "plain" and eng._staging_dir is None
    assert eng.weight_spec()["model.norm.weight"] == ((256,), "bfloat16")


def test_staging_files_of_dead_processes_are_removed_at_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    from rollout.engine.vllm_staging import remove_orphaned_stages as _remove_orphaned_stages

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"grpo-fleet-stage-{int(dead.stdout)}-1.bin"
    mine = tmp_path / f"grpo-fleet-stage-{os.getpid()}-2.bin"
    other = tmp_path / "something-else.bin"
    for f in (orphan, mine, other):
        f.write_bytes(b"x")
    _remove_orphaned_stages(str(tmp_path))
    assert not orphan.exists() and mine.exists() and other.exists()
