"""Pieces of benchmarks/trainer_gpu_bench.py: model shapes, FLOP counts (both MFU conventions), agent-mode
observation spans, the peak-memory split, and the on-device check of the fused log-prob's saved vs recomputed logit
gradients (profiles and kernel microbenchmarks: trainer_gpu_profile.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch

PEAK_FLOPS = 989e12  # dense bf16, H100/H200 SXM
SHAPES: dict[str, dict[str, int]] = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936),
}
GIB = 2**30


def flops_per_token(model: Any, seq_len: int, *, causal: bool, head_fraction: float = 1.0) -> float:
    """6 N (N = all parameters, the tied embedding once: it is the lm_head matmul) + attention 12 L H S, halved when
    `causal`: a causal kernel computes only the lower triangle of QK^T and PV, so the full count credits FLOPs no
    kernel does. The causal-aware figure is the headline; the full count is the convention of issue 6. The lm_head's
    6 V H counts only on the `head_fraction` of tokens that go through it (the trainer skips masked-out ones)."""
    n = sum(p.numel() for p in model.parameters())
    c = model.config
    head = c.vocab_size * c.hidden_size
    attn = 12.0 * c.num_hidden_layers * c.hidden_size * seq_len
    return 6.0 * (n - head) + 6.0 * head * head_fraction + (attn / 2 if causal else attn)


def observation_spans(n: int, *, seed: int = 0, generated: tuple[int, int] = (64, 768),
                      observed: tuple[int, int] = (128, 2048)) -> list[tuple[int, int]]:
    """An agent trajectory of `n` response tokens as (start, length) observation spans (tool output, in the context
    but not in the loss) between generated spans (trained), span lengths uniform in the given ranges, starting with a
    generated span (about 28% of the tokens generated)."""
    g = torch.Generator().manual_seed(seed)
    spans, t, gen = [], 0, True
    while t < n:
        lo, hi = generated if gen else observed
        span = min(n - t, int(torch.randint(lo, hi + 1, (1,), generator=g)))
        if not gen:
            spans.append((t, span))
        t, gen = t + span, not gen
    return spans


class ActivationProbe:
    """Memory the decoder stack's forward leaves allocated (saved activations, autocast's bf16 weight copies, the
    output hidden states): allocated at its end minus at its start. Hooks stay until `close()`."""

    def __init__(self, decoder: torch.nn.Module) -> None:
        self.before = self.after = 0
        self._handles = [decoder.register_forward_pre_hook(self._pre), decoder.register_forward_hook(self._post)]

    def _pre(self, *_: Any) -> None:
        self.before = torch.cuda.memory_allocated()

    def _post(self, *_: Any) -> None:
        self.after = torch.cuda.memory_allocated()

    def close(self) -> float:
        for h in self._handles:
            h.remove()
        return (self.after - self.before) / GIB


def logits_sweep(hidden: int, vocab: int, lengths: list[int], budgets_gb: list[float], *, chunk: int,
                 device: torch.device) -> list[dict[str, Any]]:
    """`logits_memory_gb` at each token count and saved-gradient budget: flat in length once the budget is full."""
    rows = [{"tokens": n, "saved_grad_gb": b,
             "logits_gb": logits_memory_gb(hidden, vocab, n, chunk=chunk, saved_bytes=int(b * GIB), device=device)}
            for b in budgets_gb for n in lengths]
    for r in rows:
        print(r, flush=True)
    return rows


def logits_memory_gb(hidden: int, vocab: int, tokens: int, *, chunk: int, saved_bytes: int,
                     device: torch.device) -> float:
    """Peak memory of the fused lm_head + log-softmax alone, forward + backward, over its inputs (as in the step:
    fp32 hidden states and weight under bf16 autocast). Includes its fp32 weight-gradient accumulator and the
    hidden-state gradient; what grows with `tokens` beyond those is the kept logit gradients, up to `saved_bytes`."""
    from trainer.logprobs import linear_logprobs

    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(tokens, hidden, device=device, generator=g).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device, generator=g) * 0.02).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device=device, generator=g)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = linear_logprobs(h, w, t, chunk=chunk, compiled=device.type == "cuda", save_bytes=saved_bytes)
    out.sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del h, w, t, out
    return peak / GIB


def check_logprob_grads(device: torch.device) -> dict[str, float]:
    """The compiled lm_head + log-softmax on this device, logit gradients saved vs recomputed (bf16 autocast over
    fp32 inputs, as in the step): the largest difference relative to the largest entry, per output."""
    from trainer.logprobs import linear_logprobs

    g = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(5000, 896, device=device, generator=g)
    w = torch.randn(32000, 896, device=device, generator=g) * 0.05
    t = torch.randint(0, 32000, (5000,), device=device, generator=g)
    go = torch.randn(5000, device=device, generator=g)
    res = []
    for save in (0, 1 << 30):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out = linear_logprobs(hh, ww, t, chunk=1024, compiled=device.type == "cuda", save_bytes=save)
        res.append((out.detach(), *torch.autograd.grad(out, (hh, ww), go)))
    names = ("logprob", "grad_hidden", "grad_weight")
    return {n: float((a - b).abs().max() / b.abs().max()) for n, a, b in zip(names, res[1], res[0], strict=True)}


def trainer_config(args: argparse.Namespace, seq_len: int, batch: int, ac: str, world: int) -> Any:
    """The trainer config of the measurement, the real `MasterConfig`. The lent GPU machines lack pydantic: carry it
    as the fleet's scripts do (`bash benchmarks/gpu_fleet_swe.sh prepare` fills `.whl/`; a stand-in config once
    drifted from the real one and stopped this benchmark there)."""
    values = {
        "policy.precision": "bfloat16", "policy.compile": not args.no_compile,
        "policy.activation_checkpointing": ac != "none",
        "policy.activation_checkpointing_scope": "layer" if ac == "none" else ac,
        "policy.logprob_chunk_tokens": args.chunk, "policy.fsdp_reshard_after_forward": not args.keep_gathered,
        "policy.logprob_saved_grad_gb": args.saved_grad_gb,
        "policy.low_precision_residual": not args.fp32_residual,
        "policy.attn_implementation": args.attn,
        "policy.max_total_sequence_length": seq_len,
        "policy.generation.max_new_tokens": 16, "policy.train_global_batch_size": batch * world,
        "policy.train_micro_batch_size": batch, "grpo.num_prompts_per_step": batch * world,
        "grpo.num_generations_per_prompt": 1, "policy.optimizer.lr": 1e-6,
        "loss_fn.reference_policy_kl_penalty": 0.0, "loss_fn.use_importance_sampling_correction": True,
        "loss_fn.truncated_importance_sampling_type": "tis", "loss_fn.truncated_importance_sampling_ratio": 2.0,
    }
    from fleet.config import parse_config

    return parse_config({}, [f"{k}={json.dumps(v)}" for k, v in values.items()])


def grpo_batch(n: int, seq_len: int, vocab: int, agent: bool) -> Any:
    from fleet.contracts.groups import PromptGroup, ScoredGroup, Trajectory
    from fleet.contracts.sandbox import Verdict
    from trainer.batch import build_step_batch

    g = torch.Generator().manual_seed(0)
    groups = []
    for i in range(n):
        resp = torch.randint(0, vocab, (seq_len - 1,), generator=g).tolist()
        # -11.9 ~ log(1 / vocab): random weights give about that, so the IS weights stay near 1.
        spans = observation_spans(len(resp), seed=i) if agent else []
        traj = Trajectory(resp, [-11.9] * len(resp), [0] * len(resp), float(i % 2), Verdict(status="completed"), "",
                          observation_spans=spans)
        groups.append(ScoredGroup(PromptGroup(group_id=f"0:{i}", prompt_token_ids=[1]), [traj], "w", 0, 0, 0))
    # One generation per group gives zero advantages; give them signs so the loss has a gradient.
    batch = build_step_batch(groups, 0, leave_one_out=False, normalize=False, max_len=seq_len)
    for i, s in enumerate(batch.samples):
        s.advantage = 1.0 if i % 2 else -1.0
    return batch
