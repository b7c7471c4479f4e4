"""The batched HF engine against the one-request path (`HfEngine`), on the tiny model (CPU, float32).

Requests of different prompt lengths and budgets, more of them than the batched engine has slots, so that requests
join as others leave, and prefills are split by a small prefill budget. Greedy tokens must be identical and log-probs
equal within the contract's tolerance (measured here: < 1e-6).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rollout.engine import Generation, SamplingSpec
from rollout.engine.hf_batched import BatchedHfEngine
from rollout.engine.hf_engine import HfEngine
from workshop.tinymodel import ensure_tiny_model

TOL = 1e-4
FORCED = 1234
PROMPTS = [[1 + i, 87, 425, 201, 57, 1851, 314][: 2 + i % 6] * (1 + i % 3) for i in range(14)]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


def greedy(n: int) -> SamplingSpec:
    return SamplingSpec(max_new_tokens=n, temperature=0, ignore_eos=True)


async def wait_for_tokens(engine: HfEngine, n: int) -> None:
    deadline = time.monotonic() + 60
    while engine.tokens_generated < n:
        assert time.monotonic() < deadline, "engine produced no tokens"
        await asyncio.sleep(0.01)


async def run_all(engine: HfEngine, specs: list[SamplingSpec], stagger_s: float = 0.0) -> list[Generation]:
    async def one(i: int) -> Generation:
        await asyncio.sleep(stagger_s * i)
        return await engine.generate(f"r{i}", PROMPTS[i], specs[i])

    await engine.start()
    try:
        return list(await asyncio.gather(*(one(i) for i in range(len(specs)))))
    finally:
        await engine.stop()


async def test_greedy_tokens_and_logprobs_equal_the_one_request_path_as_requests_join_and_leave(
    tiny_model: Path,
) -> None:
    specs = [greedy(5 + 3 * i) for i in range(len(PROMPTS))]
    ref = await run_all(HfEngine(tiny_model, max_model_len=256, device="cpu"), specs)
    eng = BatchedHfEngine(tiny_model, max_model_len=256, device="cpu", max_num_seqs=4, max_prefill_tokens=24)
    got = await run_all(eng, specs, stagger_s=0.01)
    for r, g in zip(ref, got, strict=True):
        assert g.token_ids == r.token_ids and g.finish_reason == r.finish_reason == "length"
        assert max(abs(a - b) for a, b in zip(g.logprobs, r.logprobs, strict=True)) < TOL
    assert eng.forwards["prefill"] >= 5  # 14 requests through 4 slots, a budget of 24 prompt tokens per prefill
    assert eng.forwards["decode"] < sum(s.max_new_tokens for s in specs) / 2  # rows shared decode forwards
    # The worker's summary carries the same counters and where their time went (no CUDA graphs on the CPU).
    figures = eng.figures()
    assert figures["prefill"] == eng.forwards["prefill"] and figures["graph_captures"] == 0
    assert figures["decode_forward_s"] > 0 and figures["prefill_s"] > 0
    assert HfEngine(tiny_model, max_model_len=256, device="cpu").figures() == {}


async def test_requests_that_stop_inside_a_multi_step_round_match_one_step_rounds_and_the_one_request_path(
    tiny_model: Path,
) -> None:
    # Each request stops on a token it would emit a few steps in (so inside an 8-step round), or runs into the end
    # of a short context (its lookahead steps then sit at the last position), or samples with its own seed.
    max_len = 40
    free = [greedy(30) for _ in PROMPTS]
    ref_free = await run_all(HfEngine(tiny_model, max_model_len=max_len, device="cpu"), free)
    specs = []
    for i, g in enumerate(ref_free):
        if i % 3 == 0:
            specs.append(SamplingSpec(max_new_tokens=30, temperature=0, ignore_eos=True,
                                      stop_token_ids=[g.token_ids[3 + i % 5]]))
        elif i % 3 == 1:
            specs.append(greedy(60))
        else:
            specs.append(SamplingSpec(max_new_tokens=17, temperature=0.9, top_p=0.9, seed=i, ignore_eos=True))
    ref = await run_all(HfEngine(tiny_model, max_model_len=max_len, device="cpu"), specs)
    runs = {}
    for steps in (1, 8):
        eng = BatchedHfEngine(tiny_model, max_model_len=max_len, device="cpu", max_num_seqs=5, decode_steps=steps)
        runs[steps] = await run_all(eng, specs, stagger_s=0.01)
        assert eng.forwards["decode_rounds"] * (1 if steps == 1 else 2) <= eng.forwards["decode"]
    assert {g.finish_reason for g in ref} == {"stop", "length"}
    for i, r in enumerate(ref):
        one, multi = runs[1][i], runs[8][i]
        assert one.token_ids == multi.token_ids and one.finish_reason == multi.finish_reason
        assert one.token_versions == multi.token_versions  # log-probs: the attended window differs, so < TOL
        assert max(abs(a - b) for a, b in zip(one.logprobs, multi.logprobs, strict=True)) < TOL
        if specs[i].temperature == 0:  # the sequential engine samples from its own generator
            assert multi.token_ids == r.token_ids and multi.finish_reason == r.finish_reason
            assert max(abs(a - b) for a, b in zip(multi.logprobs, r.logprobs, strict=True)) < TOL
        assert len(PROMPTS[i]) + len(multi.token_ids) <= max_len


async def test_a_seeded_request_samples_the_same_tokens_alone_or_in_a_crowd(tiny_model: Path) -> None:
    spec = SamplingSpec(max_new_tokens=24, temperature=1.0, top_p=0.95, seed=11, ignore_eos=True)
    other = SamplingSpec(max_new_tokens=30, temperature=0.8, top_k=20, ignore_eos=True)

    async def crowd(n_others: int) -> Generation:
        eng = BatchedHfEngine(tiny_model, max_model_len=256, device="cpu", max_num_seqs=8)
        await eng.start()
        try:
            others = [asyncio.create_task(eng.generate(f"o{i}", PROMPTS[i], other)) for i in range(n_others)]
            await asyncio.sleep(0.05)  # the seeded request joins mid-run, in whichever slot is free
            g = await eng.generate("seeded", PROMPTS[3], spec)
            await asyncio.gather(*others)
            return g
        finally:
            await eng.stop()

    alone, crowded = await crowd(0), await crowd(6)
    assert alone.token_ids == crowded.token_ids
    assert len(set(alone.token_ids)) > 3  # it sampled, not a degenerate greedy run


async def test_in_flight_update_switches_every_row_of_the_batch_once(tiny_model: Path) -> None:
    eng = BatchedHfEngine(tiny_model, max_model_len=256, device="cpu", max_num_seqs=4)
    await eng.start()
    try:
        tasks = [asyncio.create_task(eng.generate(f"b{i}", PROMPTS[i], greedy(120))) for i in range(6)]
        await wait_for_tokens(eng, 4 * 20)
        w = load_file(tiny_model / "model.safetensors")
        for k in w:  # greedy decoding emits FORCED after any context (see test_engine_contract.forcing_weights)
            if k.endswith(("o_proj.weight", "down_proj.weight")):
                w[k].zero_()
        w["model.norm.weight"].zero_()
        w["model.norm.weight"][0] = 1.0
        w["model.embed_tokens.weight"][:, 0] = 1.0
        w["model.embed_tokens.weight"][FORCED, 0] = 3.0
        stats = await eng.update_weights(1, w, in_flight=True, reset_cache=False)
        gens = await asyncio.gather(*tasks)
    finally:
        await eng.stop()
    assert stats.requests_in_flight == 6  # four in slots, two waiting for one
    started_old = 0
    for g in gens:
        k = g.token_versions.index(1) if 1 in g.token_versions else len(g.token_ids)
        assert g.token_versions == [0] * k + [1] * (120 - k)
        assert g.token_ids[k:] == [FORCED] * (120 - k) and FORCED not in g.token_ids[:k]
        started_old += k > 0
    assert started_old == 4  # the two waiting requests started after the load: every token is new


async def test_slots_are_given_back_when_requests_finish_or_are_cancelled(tiny_model: Path) -> None:
    eng = BatchedHfEngine(tiny_model, max_model_len=256, device="cpu", max_num_seqs=3)
    await eng.start()
    try:
        tasks = [asyncio.create_task(eng.generate(f"c{i}", PROMPTS[i], greedy(200))) for i in range(3)]
        await wait_for_tokens(eng, 3 * 5)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        g = await eng.generate("after", PROMPTS[0], greedy(4))
        assert len(g.token_ids) == 4
        await asyncio.sleep(0.05)
        assert sorted(eng._free) == [0, 1, 2] and not eng._owner
    finally:
        await eng.stop()


async def test_a_kv_budget_that_holds_no_sequence_is_refused_naming_the_key(tiny_model: Path) -> None:
    eng = BatchedHfEngine(tiny_model, max_model_len=256, device="cpu", kv_cache_gb=1e-6)
    with pytest.raises(ValueError, match=r"policy\.generation\.hf_cfg\.kv_cache_gb"):
        await eng.start()


async def test_a_groups_samples_share_one_prefill_and_match_the_one_request_path(tiny_model: Path) -> None:
    # The greedy request comes last: it is not the one prefilled, so its tokens check the copied KV.
    specs = [SamplingSpec(max_new_tokens=12, temperature=1.0, seed=s, ignore_eos=True) for s in range(5)]
    specs.append(greedy(12))
    ref_eng = HfEngine(tiny_model, max_model_len=256, device="cpu")
    await ref_eng.start()
    try:
        ref = await ref_eng.generate("ref", PROMPTS[5], specs[-1])
    finally:
        await ref_eng.stop()
    eng = BatchedHfEngine(tiny_model, max_model_len=256, device="cpu", max_num_seqs=8)
    await eng.start()
    try:
        gens = await asyncio.gather(*(eng.generate(f"g{i}", PROMPTS[5], s) for i, s in enumerate(specs)))
    finally:
        await eng.stop()
    assert eng.forwards["prefill"] == 1  # one forward for the prompt; the other five rows copied its KV
    assert gens[-1].token_ids == ref.token_ids
    assert max(abs(a - b) for a, b in zip(gens[-1].logprobs, ref.logprobs, strict=True)) < TOL
    assert len({tuple(g.token_ids) for g in gens[:-1]}) > 1  # the copies sample their own streams
