"""`policy.low_precision_residual`: one process under bf16 autocast runs the residual stream in bf16 (as FSDP2's
mixed precision does) instead of the fp32 of the master weights, and the log-probs and gradients stay within bf16
rounding of the fp32-residual path; with float32 precision it changes nothing."""

from __future__ import annotations

from typing import Any

import torch

from fleet.config import parse_config
from trainer.dist import Dist, DistEnv
from trainer.logprobs import pack
from trainer.model import autocast, forward_logprobs, wrap_policy

VOCAB = 300


def _tiny_lm() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=64, vocab_size=VOCAB, tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).float().train()


def _run(precision: str, low: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor], set[torch.dtype]]:
    """Log-probs of two packed samples, every parameter's gradient of their sum, and the dtypes the decoder
    layers received as their hidden states."""
    cfg = parse_config({}, [f"policy.precision={precision}", f"policy.low_precision_residual={str(low).lower()}"])
    dist = Dist(DistEnv(0, 1, 0), torch.device("cpu"), timeout_s=60)
    policy = wrap_policy(_tiny_lm(), cfg.policy, dist)
    seen: set[torch.dtype] = set()
    for layer in policy.lm.model.layers:
        layer.register_forward_pre_hook(lambda _m, args, kw: seen.add((args[0] if args else kw["hidden_states"]).dtype),
                                        with_kwargs=True)
    g = torch.Generator().manual_seed(1)
    responses = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (23, 17)]
    packed = pack([[5, 6], [7]], responses, row_tokens=64)
    with autocast(cfg.policy, dist):
        lp = forward_logprobs(policy, packed, torch.device("cpu"))
    lp.sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in policy.named_parameters() if p.grad is not None}
    return lp.detach(), grads, seen


def test_low_precision_residual_feeds_bf16_hidden_states_to_every_layer() -> None:
    assert _run("bfloat16", low=True)[2] == {torch.bfloat16}
    assert _run("bfloat16", low=False)[2] == {torch.float32}


def test_low_precision_residual_stays_within_bf16_rounding_of_the_fp32_residual() -> None:
    lp_low, grads_low, _ = _run("bfloat16", low=True)
    lp_ref, grads_ref, _ = _run("bfloat16", low=False)
    assert grads_low.keys() == grads_ref.keys()
    # bf16 keeps 8 bits of mantissa: a few parts in a thousand per rounding, some dozens of roundings deep.
    assert torch.allclose(lp_low, lp_ref, rtol=0, atol=0.05 * float(lp_ref.abs().mean()))
    for name, ref in grads_ref.items():
        err = float((grads_low[name] - ref).norm() / ref.norm().clamp_min(1e-12))
        assert err < 0.1, f"{name}: relative gradient error {err:.3f}"


def test_low_precision_residual_is_a_no_op_in_float32() -> None:
    lp_low, grads_low, seen = _run("float32", low=True)
    lp_ref, grads_ref, _ = _run("float32", low=False)
    assert seen == {torch.float32}
    assert torch.equal(lp_low, lp_ref)
    assert all(torch.equal(grads_low[n], g) for n, g in grads_ref.items())
