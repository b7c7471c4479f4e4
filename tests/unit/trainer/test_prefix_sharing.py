"""Prompts shared by a group's answers (`policy.prefix_sharing`): the shared layout gives every sample the log-probs
and every parameter the gradient of the unshared packed layout (sdpa and eager attention, float64), lays each
group's prompt out once, cuts a group that does not fit a row into several trees, and keeps a group's samples in one
micro-batch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fleet.config import parse_config
from trainer.batch import StepBatch, TrainSample, plan_rank
from trainer.logprobs import pack, trained_only
from trainer.model import PolicyModule, forward_logprobs

VOCAB = 97


def _tiny_lm(attn: str) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=VOCAB, tie_word_embeddings=True, use_cache=False,
                      attn_implementation=attn)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).double().train()


def _groups() -> tuple[list[list[int]], list[list[int]]]:
    """Three groups (prompts of 7, 3 and 11 tokens) of four answers of 1-6 tokens each, interleaved as a
    length-sorted micro-batch would hold them."""
    g = torch.Generator().manual_seed(3)
    heads = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in (7, 3, 11)]
    prompts, responses = [], []
    for k in range(4):
        for head in heads:
            prompts.append(list(head))
            responses.append(torch.randint(1, VOCAB, (1 + (k * 5 + len(head)) % 6,), generator=g).tolist())
    return prompts, responses


def _logprobs_and_grads(lm: Any, packed: Any, weights: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    lm.zero_grad(set_to_none=True)
    lp = forward_logprobs(PolicyModule(lm, temperature=0.7, chunk_tokens=16), packed, torch.device("cpu"))
    (lp * weights).sum().backward()
    return lp.detach(), {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}


def _assert_same_grads(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Equal up to float32 rounding: the fused head computes its softmax (and the lm_head's gradient) in float32, so
    a token's logits rounded in another chunk of tokens can differ in the last fp32 bit (a wrong mask or position is
    off by far more)."""
    assert got.keys() == want.keys()
    for name, grad in want.items():
        err = (got[name] - grad).abs().max().item()
        assert err <= 1e-5 * grad.abs().max().item(), (name, err)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_shared_prompts_give_the_unshared_log_probs_and_gradients(attn: str) -> None:
    lm = _tiny_lm(attn)
    prompts, responses = _groups()
    plain = pack(prompts, responses, row_tokens=40)
    shared = pack(prompts, responses, row_tokens=40, share_prefixes=True)
    assert plain.attention_mask is None and shared.attention_mask is not None
    assert shared.shared_tokens > 0
    weights = torch.randn(len(prompts), plain.max_response, dtype=torch.float64,
                          generator=torch.Generator().manual_seed(5))
    lp_plain, g_plain = _logprobs_and_grads(lm, plain, weights)
    lp_shared, g_shared = _logprobs_and_grads(lm, shared, weights)
    assert torch.allclose(lp_shared, lp_plain, atol=1e-10), (lp_shared - lp_plain).abs().max()
    _assert_same_grads(g_shared, g_plain)


def test_each_groups_prompt_is_laid_out_once_per_tree() -> None:
    prompts, responses = _groups()
    shared = pack(prompts, responses, row_tokens=64, share_prefixes=True)
    distinct = {tuple(p) for p in prompts}
    expected = sum(len(p) for p in distinct) + sum(len(r) for r in responses)
    assert shared.input_ids.numel() - shared.padded_tokens == expected
    assert shared.shared_tokens == sum(len(p) for p in prompts) - sum(len(p) for p in distinct)


def test_a_group_too_long_for_a_row_is_cut_into_trees_that_fit() -> None:
    prompt = list(range(1, 9))
    responses = [[10 + i] * 5 for i in range(6)]  # 8 + 6 x 5 = 38 tokens, rows of 20: 8 + 2 x 5 per tree
    shared = pack([prompt] * 6, responses, row_tokens=20, share_prefixes=True)
    assert shared.input_ids.shape == (3, 18)
    assert all(row[:8].tolist() == prompt for row in shared.input_ids)
    mask = shared.attention_mask
    assert mask is not None
    # The second answer of a tree sees the prompt and itself, never the first answer.
    assert mask[0, 0, 13:18, :8].all() and not mask[0, 0, 13:18, 8:13].any()


def test_training_only_masked_in_tokens_keeps_the_shared_layout_exact() -> None:
    lm = _tiny_lm("sdpa")
    prompts, responses = _groups()
    head = torch.zeros(len(prompts), max(map(len, responses)))
    for i, r in enumerate(responses):
        head[i, : len(r)] = torch.tensor([float(j % 2 == 0) for j in range(len(r))])
    weights = head.double()
    lp_plain, g_plain = _logprobs_and_grads(lm, trained_only(pack(prompts, responses, row_tokens=40), head), weights)
    lp_shared, g_shared = _logprobs_and_grads(
        lm, trained_only(pack(prompts, responses, row_tokens=40, share_prefixes=True), head), weights)
    assert torch.allclose(lp_shared, lp_plain, atol=1e-10)
    _assert_same_grads(g_shared, g_plain)


def _sample(group: str, prompt: list[int], n: int) -> TrainSample:
    return TrainSample(group, prompt, list(range(1, n + 1)), [-1.0] * n, advantage=1.0, reward=1.0, version=0)


@pytest.mark.parametrize("world", [1, 2])
def test_plan_keeps_a_groups_samples_in_one_micro_batch(world: int) -> None:
    prompts = {f"g{k}": [k + 1] * (3 + k) for k in range(4)}
    # Answers of every group interleaved, lengths mixed: a length sort alone would scatter the groups.
    samples = [_sample(g, p, 1 + (i * 3 + k) % 5) for i in range(4) for k, (g, p) in enumerate(prompts.items())]
    batch = StepBatch(step=1, samples=samples, group_ids=list(prompts))
    plans = [plan_rank(batch, global_batch=16, micro_batch=4, rank=r, world=world, row_tokens=64, packing=True,
                       share_prefixes=True) for r in range(world)]
    real = [mb for plan in plans for mb in plan[0] if not mb.dummy]
    assert sum(mb.packed.num_samples for mb in real) == len(samples)
    for mb in real:  # the four answers of one group, its prompt laid out once
        first = mb.packed.input_ids[0, 0].item()
        assert mb.packed.num_samples == 4 and mb.packed.input_ids.shape[0] == 1
        assert mb.packed.shared_tokens == 3 * len(prompts[f"g{first - 1}"])


def test_prefix_sharing_refuses_flash_attention_naming_the_key() -> None:
    with pytest.raises(ValueError, match="policy.prefix_sharing"):
        parse_config({}, ["policy.prefix_sharing=true", "policy.attn_implementation=flash_attention_2"])
