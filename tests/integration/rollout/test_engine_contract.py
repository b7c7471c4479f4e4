"""The generation-engine contract, run against both engines on the tiny model (CPU, float32).

One engine per backend for the whole module (vLLM takes ~17 s to start). Tests push weights, so `Served` tracks what
the engine serves, and every test derives its reference from it.

Tolerance: per-token log-probs vs a transformers forward of the same weights, max |diff| < 1e-4. Measured on this
machine: 1e-6 (vLLM CPU and HF, fp32), so the bound leaves room for other CPUs' kernels while still catching a
temperature-scaled (processed) log-prob, a wrong weight, or a stale KV entry (all >= 1e-2 here).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import torch
from safetensors.torch import load_file

from rollout.engine import GenerationEngine, SamplingSpec, StaleVersionError, WeightMismatchError
from rollout.engine.base import StagedWeights
from workshop.tinymodel import ensure_tiny_model

pytestmark = pytest.mark.asyncio(loop_scope="module")

LOGPROB_TOL = 1e-4
PROMPT = [1, 87, 425, 201, 57, 1851, 314, 223, 19, 20]
FORCED = 1234


@dataclass
class Served:
    weights: dict[str, torch.Tensor]
    version: int = 0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


@pytest_asyncio.fixture(
    scope="module", loop_scope="module", params=["hf", "hf-batched", pytest.param("vllm", marks=pytest.mark.vllm)]
)
async def engine(request: pytest.FixtureRequest, tiny_model: Path) -> AsyncIterator[GenerationEngine]:
    if request.param == "vllm":
        pytest.importorskip("vllm")
        from fleet.config.policy import VllmConfig
        from rollout.engine.vllm_engine import VllmEngine

        # stage_min_bytes=0: pushes take the tmpfs-file path that real models use (the tiny one would go inline).
        eng: GenerationEngine = VllmEngine(
            tiny_model, VllmConfig(max_num_seqs=16, cpu_kvcache_space_gb=0.25), max_model_len=512, stage_min_bytes=0
        )
    elif request.param == "hf-batched":
        from rollout.engine.hf_batched import BatchedHfEngine

        # 8 slots: the group tests' requests outnumber them, so some wait for a slot and join mid-run.
        eng = BatchedHfEngine(tiny_model, max_model_len=512, device="cpu", max_num_seqs=8)
    else:
        from rollout.engine.hf_engine import HfEngine

        eng = HfEngine(tiny_model, max_model_len=512, device="cpu")
    await eng.start()
    yield eng
    await eng.stop()


@pytest.fixture(scope="module")
def served(engine: GenerationEngine, tiny_model: Path) -> Served:
    return Served(load_file(tiny_model / "model.safetensors"))


def reference_logprobs(model_dir: Path, weights: dict[str, torch.Tensor], prompt: list[int], tokens: list[int]):
    """What the trainer computes: one transformers forward over prompt + answer, log_softmax in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(weights, strict=False)  # tied head follows the embedding
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
    return lp.gather(1, torch.tensor(tokens)[:, None])[:, 0]


def forcing_weights(base: dict[str, torch.Tensor], token: int) -> dict[str, torch.Tensor]:
    """Weights under which greedy decoding emits `token` after any context: every layer writes nothing to the
    residual stream (o_proj, down_proj = 0), so the final hidden state is the input embedding; the final norm keeps
    only dim 0, where every embedding row is 1 except `token`'s, which is 3 (margin ~30 nats in the logits)."""
    w = {k: v.clone() for k, v in base.items()}
    for k in w:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            w[k].zero_()
    w["model.norm.weight"].zero_()
    w["model.norm.weight"][0] = 1.0
    w["model.embed_tokens.weight"][:, 0] = 1.0
    w["model.embed_tokens.weight"][token, 0] = 3.0
    return w


def perturbed(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: v + 0.02 * torch.randn(v.shape, generator=g) for k, v in base.items()}


async def push(engine: GenerationEngine, served: Served, weights: dict[str, torch.Tensor], **kw: bool):
    kept = {k: v.clone() for k, v in weights.items()}  # staged memory is taken over (and reused) by the engine
    stats = await engine.update_weights(served.version + 1, weights, **{"in_flight": True, "reset_cache": False, **kw})
    served.version += 1
    served.weights = kept
    assert engine.served_version == served.version == stats.version
    return stats


async def wait_for_tokens(engine: GenerationEngine, n: int) -> None:
    start, deadline = engine.tokens_generated, time.monotonic() + 60
    while engine.tokens_generated - start < n:
        assert time.monotonic() < deadline, "engine produced no tokens"
        await asyncio.sleep(0.01)


def greedy(n: int) -> SamplingSpec:
    return SamplingSpec(max_new_tokens=n, temperature=0.0, ignore_eos=True)


# -- the generation contract ------------------------------------------------------------------------------------
async def test_group_of_g_samples_has_raw_logprobs_and_versions(
    engine: GenerationEngine, served: Served, tiny_model: Path
) -> None:
    g_size = 4
    # Tempered, truncated sampling: the returned log-probs must still be those of the raw logits.
    spec = SamplingSpec(max_new_tokens=32, temperature=0.7, top_p=0.9, top_k=50, ignore_eos=True)
    before = engine.tokens_generated
    gens = await asyncio.gather(*(engine.generate(f"group/{i}", PROMPT, spec) for i in range(g_size)))
    assert len({tuple(g.token_ids) for g in gens}) > 1, "G samples should differ under sampling"
    assert engine.tokens_generated - before == sum(len(g.token_ids) for g in gens)
    for g in gens:
        assert len(g.token_ids) == len(g.logprobs) == len(g.token_versions) == 32
        assert g.finish_reason == "length" and g.prompt_len == len(PROMPT)
        assert set(g.token_versions) == {served.version}
        ref = reference_logprobs(tiny_model, served.weights, PROMPT, g.token_ids)
        assert (ref - torch.tensor(g.logprobs)).abs().max().item() < LOGPROB_TOL


async def test_eos_and_stop_token_end_generation(engine: GenerationEngine, served: Served) -> None:
    free = await engine.generate("free", PROMPT, greedy(8))
    stop_at = free.token_ids[3]
    g = await engine.generate("stop", PROMPT, SamplingSpec(max_new_tokens=8, temperature=0, stop_token_ids=[stop_at]))
    assert g.finish_reason == "stop"
    assert g.token_ids == free.token_ids[: free.token_ids.index(stop_at) + 1]


async def test_stop_string_ends_generation_and_is_kept(engine: GenerationEngine, tiny_model: Path) -> None:
    from fleet.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_model)
    free = await engine.generate("free-text", PROMPT, greedy(16))
    text = tok.decode(free.token_ids, skip_special_tokens=True)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    g = await engine.generate("stop-str", PROMPT, SamplingSpec(max_new_tokens=16, temperature=0, stop_strings=[stop]))
    assert g.finish_reason == "stop" and stop in tok.decode(g.token_ids, skip_special_tokens=True)
    assert g.token_ids == free.token_ids[: len(g.token_ids)] and len(g.token_ids) < 16


async def test_cancelled_request_leaves_engine_serving(engine: GenerationEngine) -> None:
    task = asyncio.create_task(engine.generate("to-cancel", PROMPT, greedy(400)))
    await wait_for_tokens(engine, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    g = await engine.generate("after-cancel", PROMPT, greedy(4))
    assert len(g.token_ids) == 4


# -- weight updates -----------------------------------------------------------------------------------------------
async def test_in_flight_update_switches_tokens_to_new_version(
    engine: GenerationEngine, served: Served, tiny_model: Path
) -> None:
    old = served.version
    tasks = [asyncio.create_task(engine.generate(f"long/{i}", PROMPT, greedy(200))) for i in range(3)]
    await wait_for_tokens(engine, 3 * 30)
    stats = await push(engine, served, forcing_weights(served.weights, FORCED), in_flight=True)
    gens = await asyncio.gather(*tasks)

    assert stats.pause_s > 0 and stats.load_s > 0 and stats.pause_s >= stats.load_s
    assert stats.requests_in_flight == 3
    for g in gens:
        assert len(g.token_ids) == 200 and g.finish_reason == "length"  # (a) completed
        k = g.token_versions.index(served.version)  # first token of the new weights
        assert 0 < k < 200, "the push should land mid-generation"
        assert g.token_versions == [old] * k + [served.version] * (200 - k)  # (b) versions switch once, exactly
        assert g.token_ids[k:] == [FORCED] * (200 - k)  # (c) what the new weights produce
        assert FORCED not in g.token_ids[:k]
        assert max(abs(x) for x in g.logprobs[k:]) < 1e-3  # FORCED has probability ~1 under the new weights


@pytest.mark.parametrize("reset_cache", [True, False], ids=["reset_cache", "keep_cache"])
async def test_reset_cache_recomputes_kv_of_requests_in_flight(
    engine: GenerationEngine, served: Served, tiny_model: Path, reset_cache: bool
) -> None:
    base = load_file(tiny_model / "model.safetensors")
    await push(engine, served, base)  # a fresh, non-degenerate starting point
    # The new weights are made before the requests start: made between the token wait and the push, they let both
    # requests finish first on a loaded CI host (the push then landed after the last token).
    new = perturbed(base, seed=3)
    tasks = [asyncio.create_task(engine.generate(f"kv{reset_cache}/{i}", PROMPT, greedy(200))) for i in range(2)]
    await wait_for_tokens(engine, 2 * 20)
    stats = await push(engine, served, new, reset_cache=reset_cache)
    assert stats.kv_recomputed == reset_cache
    for g in await asyncio.gather(*tasks):
        k = g.token_versions.index(served.version)
        assert 0 < k < 200
        err = (reference_logprobs(tiny_model, served.weights, PROMPT, g.token_ids) - torch.tensor(g.logprobs)).abs()
        if reset_cache:
            # Every token after the load equals a full recompute with the new weights: no old KV was used.
            assert err[k:].max().item() < LOGPROB_TOL
        else:
            # Documented contrast: keys/values of positions before the load still come from the old weights.
            assert err[k:].max().item() > 1e-3


async def test_non_in_flight_update_waits_for_requests_in_flight(
    engine: GenerationEngine, served: Served, tiny_model: Path
) -> None:
    old = served.version

    async def gen(rid: str) -> list[int]:
        return (await engine.generate(rid, PROMPT, greedy(60))).token_versions

    running = [asyncio.create_task(gen(f"drain/{i}")) for i in range(2)]
    await wait_for_tokens(engine, 2 * 5)
    update = asyncio.create_task(push(engine, served, perturbed(served.weights, seed=4), in_flight=False))
    await asyncio.sleep(0.05)
    late = asyncio.create_task(gen("drain/late"))  # arrives while the update waits: must start on new weights
    stats = await update
    versions = await asyncio.gather(*running)

    # Pushed when each had ~5 of 60 tokens, yet every token is old: they ran to the end before the load.
    assert all(v == [old] * 60 for v in versions)
    assert stats.drain_s > 0 and stats.requests_in_flight == 2
    assert await late == [served.version] * 60


async def test_mismatched_push_is_rejected_and_engine_untouched(
    engine: GenerationEngine, served: Served, tiny_model: Path
) -> None:
    probe = SamplingSpec(max_new_tokens=24, temperature=1.0, seed=7, ignore_eos=True)
    before = await engine.generate("probe/before", PROMPT, probe)
    good = served.weights
    bad_sets = {
        "model.norm.weight": {k: v for k, v in good.items() if k != "model.norm.weight"},  # missing
        "model.layers.0.mlp.up_proj.weight": {**good, "model.layers.0.mlp.up_proj.weight": torch.zeros(3, 3)},
        "model.layers.1.self_attn.q_proj.bias": {
            **good, "model.layers.1.self_attn.q_proj.bias": good["model.layers.1.self_attn.q_proj.bias"].bfloat16()
        },
        "model.layers.9.mlp.up_proj.weight": {**good, "model.layers.9.mlp.up_proj.weight": torch.zeros(1)},
    }  # fmt: skip
    for name, tensors in bad_sets.items():
        with pytest.raises(WeightMismatchError, match=name.replace(".", r"\.")):
            await engine.update_weights(served.version + 1, tensors, in_flight=True, reset_cache=True)
    with pytest.raises(StaleVersionError):
        await engine.update_weights(served.version - 1, good, in_flight=True, reset_cache=True)
    assert engine.served_version == served.version
    after = await engine.generate("probe/after", PROMPT, probe)
    assert after.token_ids == before.token_ids and after.logprobs == before.logprobs
    assert after.token_versions == before.token_versions


async def test_tied_head_alias_is_accepted(engine: GenerationEngine, served: Served, tiny_model: Path) -> None:
    """A trainer's state_dict() names the tied head too; it is accepted and follows the embedding."""
    w = forcing_weights(served.weights, FORCED)
    if hasattr(engine, "_stage_min_bytes"):
        engine._stage_min_bytes = 1 << 62  # this push travels inline, pickled in the RPC (small-model path)
    await push(engine, served, {**w, "lm_head.weight": w["model.embed_tokens.weight"]})
    g = await engine.generate("alias", PROMPT, greedy(5))
    assert g.token_ids == [FORCED] * 5 and set(g.token_versions) == {served.version}


def staged_copy(engine: GenerationEngine, weights: dict[str, torch.Tensor]) -> StagedWeights:
    """What a receiver does: ask the engine for staging memory in push order and write the bytes into it."""
    staged = engine.stage([(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in weights.items()])
    for k, v in weights.items():
        staged[k].copy_(v)
    return staged


async def test_push_received_into_staged_memory_is_served_and_the_memory_reused(
    engine: GenerationEngine, served: Served, tiny_model: Path
) -> None:
    base = load_file(tiny_model / "model.safetensors")
    w = forcing_weights(base, FORCED)
    first = staged_copy(engine, {**w, "lm_head.weight": w["model.embed_tokens.weight"]})  # with the tied alias
    first_ptrs = {t.data_ptr() for t in first.values()}
    running = asyncio.create_task(engine.generate("staged/running", PROMPT, greedy(150)))
    await wait_for_tokens(engine, 20)
    await push(engine, served, first)
    g = await running
    k = g.token_versions.index(served.version)
    assert 0 < k < 150 and g.token_ids[k:] == [FORCED] * (150 - k)

    second = staged_copy(engine, base)
    handed_out = first_ptrs | {t.data_ptr() for t in second.values()}
    await push(engine, served, second)
    g = await engine.generate("staged/base", PROMPT, greedy(12))
    ref = reference_logprobs(tiny_model, base, PROMPT, g.token_ids)
    assert (ref - torch.tensor(g.logprobs)).abs().max().item() < LOGPROB_TOL
    assert set(g.token_versions) == {served.version}

    # Refused pushes give their memory back and change nothing; the memory is handed out again.
    with pytest.raises(StaleVersionError):
        await engine.update_weights(served.version - 1, staged_copy(engine, w), in_flight=True, reset_cache=False)
    again = engine.stage([(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in base.items()])
    assert {t.data_ptr() for t in again.values()} <= handed_out  # no fresh allocation per push
    again.release()
    assert (await engine.generate("staged/after", PROMPT, greedy(12))).token_ids == g.token_ids


@pytest.mark.vllm
async def test_vllm_push_whose_packing_fails_leaves_the_served_model_as_it_was(
    engine: GenerationEngine, served: Served, tiny_model: Path
) -> None:
    from rollout.engine.vllm_engine import VllmEngine

    if not isinstance(engine, VllmEngine):
        pytest.skip("vLLM's off-pause packing")
    probe = greedy(12)
    before = await engine.generate("packfail/before", PROMPT, probe)
    staged = staged_copy(engine, forcing_weights(served.weights, FORCED))
    os.unlink(staged.file.path)  # type: ignore[attr-defined]  # the engine's worker cannot map the push any more
    with pytest.raises(RuntimeError, match=f"packing weight version {served.version + 1} failed"):
        await engine.update_weights(served.version + 1, staged, in_flight=True, reset_cache=False)
    assert engine.served_version == served.version
    after = await engine.generate("packfail/after", PROMPT, probe)
    assert after.token_ids == before.token_ids and set(after.token_versions) == {served.version}
    await push(engine, served, staged_copy(engine, forcing_weights(served.weights, FORCED)))  # the next push works
    assert (await engine.generate("packfail/next", PROMPT, greedy(4))).token_ids == [FORCED] * 4


async def test_push_loaded_as_it_arrives_and_one_abandoned_half_way(
    engine: GenerationEngine, served: Served, tiny_model: Path
) -> None:
    """What the TCP receiver does: `on_staged` before the bytes come (vLLM starts packing layer by layer), then each
    tensor reported as it lands. A push abandoned half way (the stream broke) changes nothing."""
    before = await engine.generate("arrive/before", PROMPT, greedy(8))
    weights = forcing_weights(served.weights, FORCED)
    metas = [(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in weights.items()]

    half = engine.stage(metas)
    await engine.on_staged(half)
    for i, (k, v) in enumerate(list(weights.items())[: len(weights) // 2]):
        half[k].copy_(v)
        half.tensor_received(i)
    half.release()
    assert (await engine.generate("arrive/abandoned", PROMPT, greedy(8))).token_ids == before.token_ids

    staged = engine.stage(metas)
    await engine.on_staged(staged)
    for i, (k, v) in enumerate(weights.items()):
        staged[k].copy_(v)
        staged.tensor_received(i)
        if i % 8 == 0:
            await asyncio.sleep(0.01)  # the packer waits for what has not arrived
    await push(engine, served, staged)
    g = await engine.generate("arrive/after", PROMPT, greedy(6))
    assert g.token_ids == [FORCED] * 6 and set(g.token_versions) == {served.version}
