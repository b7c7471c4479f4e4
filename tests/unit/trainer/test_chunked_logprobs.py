"""The fast log-prob path (packed rows, chunked lm_head + log-softmax, the lm_head on trained tokens only,
activation checkpointing) against the plain one (one sample per forward, full [T, vocab] logits,
`log_softmax().gather()`): the same GRPO loss and the same gradient of every parameter, on a small Qwen2 and an
agent-style mask (alternating generated and observed spans), so the long-context path cannot drift from the
reference."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from fleet.config import parse_config
from trainer.grpo import grpo_loss
from trainer.logprobs import pack, trained_only
from trainer.model import PolicyModule, apply_activation_checkpointing, forward_logprobs

VOCAB = 300
PROMPTS = [[5, 6, 7], [9, 8, 7, 6, 5]]
RESPONSE_LENGTHS = [41, 29]


def _tiny_lm() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=VOCAB, tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).float().train()


def _agent_mask(lengths: list[int], width: int) -> torch.Tensor:
    """[B, T]: generated spans (1) and observed spans (0) of varying lengths, per sample; 0 past its end."""
    mask = torch.zeros(len(lengths), width)
    for b, n in enumerate(lengths):
        t, span, generated = 0, 3 + b, True
        while t < n:
            mask[b, t : min(n, t + span)] = float(generated)
            t, span, generated = t + span, (span * 7) % 11 + 2, not generated
    return mask


def _batch() -> tuple[list[list[int]], torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    responses = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in RESPONSE_LENGTHS]
    width = max(RESPONSE_LENGTHS)
    mask = _agent_mask(RESPONSE_LENGTHS, width)
    gen = -torch.log(torch.tensor(float(VOCAB))) + 0.3 * torch.randn(len(responses), width, generator=g)
    adv = torch.tensor([1.0, -0.5])
    return responses, mask, gen * (mask != 0), adv


def _loss(lp: torch.Tensor, gen: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    cfg = parse_config({}, ["loss_fn.reference_policy_kl_penalty=0.05",
                            "loss_fn.use_importance_sampling_correction=true",
                            "loss_fn.truncated_importance_sampling_type=tis",
                            "loss_fn.truncated_importance_sampling_ratio=2.0"]).loss_fn
    # Old and reference log-probs off the current ones, so the ratio, the IS weight and the KL all move.
    old = lp.detach() + 0.05 * torch.cos(torch.arange(lp.numel()).view_as(lp).float())
    ref = lp.detach() - 0.1
    n_tok = (mask != 0).sum()
    loss, _ = grpo_loss(lp, old, gen, adv, mask, cfg, global_valid_tokens=n_tok, global_valid_seqs=2.0,
                        reference_logprobs=ref)
    return loss


def _plain_logprobs(lm: Any, responses: list[list[int]]) -> torch.Tensor:
    """The reference: each sample alone through the full model, full logits, log_softmax, gather."""
    out = torch.zeros(len(responses), max(RESPONSE_LENGTHS))
    rows = []
    for b, (prompt, resp) in enumerate(zip(PROMPTS, responses, strict=True)):
        ids = torch.tensor([prompt + resp])
        logits = lm(input_ids=ids).logits[0, len(prompt) - 1 : len(prompt) + len(resp) - 1]
        rows.append((b, logits.float().log_softmax(-1).gather(1, torch.tensor(resp)[:, None]).squeeze(1)))
    for b, values in rows:
        out = out.index_put((torch.full((values.numel(),), b), torch.arange(values.numel())), values)
    return out


def _chunked_logprobs(lm: Any, responses: list[list[int]], *, chunk: int, saved_rows: int,
                      head_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The fast path: both samples packed in one row, chunked lm_head, `saved_rows` logit-gradient rows kept; with
    `head_mask`, only its trained positions go through the lm_head (as trainer.step does)."""
    module = PolicyModule(lm, temperature=1.0, chunk_tokens=chunk, saved_grad_bytes=saved_rows * VOCAB * 4)
    packed = pack(PROMPTS, responses, row_tokens=128, packing=True)
    assert packed.input_ids.shape[0] == 1  # one packed row: block-diagonal attention is exercised too
    if head_mask is not None:
        packed = trained_only(packed, head_mask)
        assert packed.targets.numel() == int((head_mask != 0).sum())
    return forward_logprobs(module, packed, torch.device("cpu"))


def _grads(lm: Any) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in lm.named_parameters() if p.grad is not None}


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    for name in a:
        scale = b[name].abs().max().clamp(min=1e-12)
        assert ((a[name] - b[name]).abs().max() / scale).item() < 2e-5, name


@pytest.mark.parametrize(("chunk", "saved_rows", "head_on_trained_only"),
                         [(7, 0, False), (8, 16, False), (64, 70, False), (7, 0, True), (8, 16, True)])
def test_chunked_path_gives_the_plain_loss_and_gradients_on_a_multi_span_agent_mask(
        chunk: int, saved_rows: int, head_on_trained_only: bool) -> None:
    responses, mask, gen, adv = _batch()
    plain_lm = _tiny_lm()
    fast_lm = copy.deepcopy(plain_lm)
    plain_lp = _plain_logprobs(plain_lm, responses)
    plain = _loss(plain_lp, gen, adv, mask)
    plain.backward()
    fast_lp = _chunked_logprobs(fast_lm, responses, chunk=chunk, saved_rows=saved_rows,
                                head_mask=mask if head_on_trained_only else None)
    fast = _loss(fast_lp, gen, adv, mask)
    fast.backward()
    valid = mask != 0
    assert torch.allclose(fast_lp[valid], plain_lp[valid], atol=1e-5, rtol=0)
    assert torch.allclose(fast, plain, atol=1e-6, rtol=1e-5)
    _assert_close(_grads(fast_lm), _grads(plain_lm))


@pytest.mark.parametrize("scope", ["layer", "mlp"])
def test_activation_checkpointing_keeps_the_loss_and_gradients(scope: str) -> None:
    responses, mask, gen, adv = _batch()
    base_lm = _tiny_lm()
    ac_lm = copy.deepcopy(base_lm)
    apply_activation_checkpointing(ac_lm, scope)
    losses = []
    for lm in (base_lm, ac_lm):
        loss = _loss(_chunked_logprobs(lm, responses, chunk=16, saved_rows=0), gen, adv, mask)
        loss.backward()
        losses.append(loss.detach())
    assert torch.equal(losses[0], losses[1])
    _assert_close(_grads(ac_lm), _grads(base_lm))


def test_unknown_checkpointing_scope_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="activation_checkpointing_scope"):
        apply_activation_checkpointing(_tiny_lm(), "attention")
