"""Sampling for a batch of rows in one pass, each row with its own parameters and its own seeded stream.

The sequential engine draws from one `torch.Generator` per request; a batch cannot (one generator per row means one
kernel per row). Instead each row brings one uniform number per token, derived on the host from (seed, token index)
by a counter-based hash, and the token is found by inverse-CDF search in the row's (tempered, truncated)
distribution. A request's tokens therefore depend on its seed and its own logits only, not on which other requests
share its batch or its slot. Every op has static shapes, so the whole function can sit inside a captured CUDA graph.

As everywhere in the engines, the returned log-prob is of the raw logits (float32 log_softmax, before temperature and
truncation); rows with temperature 0 take the argmax.
"""

from __future__ import annotations

import numpy as np
import torch

_MASK64 = (1 << 64) - 1


def seeded_uniforms(seeds: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1) for token `index[i]` of stream `seeds[i]` (splitmix64 of the pair, uint64 arithmetic
    wrapping), with 24 bits so that each is exact in float32 and never rounds up to 1."""
    s, i = seeds.astype(np.uint64), index.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = s * np.uint64(0x9E3779B97F4A7C15) + (i + np.uint64(1)) * np.uint64(0xD1B54A32D192ED03)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float32) / np.float32(1 << 24)


def seeded_uniform(seed: int, index: int) -> float:
    """`seeded_uniforms` for one (seed, index); any Python int seed (taken modulo 2**64)."""
    return float(seeded_uniforms(np.array([seed & _MASK64], dtype=np.uint64), np.array([index]))[0])


def sample_rows(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    uniform: torch.Tensor,
    *,
    truncate: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [b], raw log-probs [b]) from logits [b, V].

    temperature [b] (<= 0: greedy), top_k [b] (<= 0: off), top_p [b] in (0, 1], uniform [b] in [0, 1).
    truncate=False skips the sort (only valid when no row has top_k or top_p < 1): the common case, and the
    cheaper one at a large vocabulary.
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    raw_lse = torch.logsumexp(logits, dim=-1)
    greedy = temperature <= 0
    x = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    if truncate:
        x, order = torch.sort(x, dim=-1, descending=True)
        ranks = torch.arange(vocab, device=logits.device)
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
        x = x.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if truncate:
        # As the sequential engine: drop a token once the (top-k renormalised) mass before it reaches top_p; the
        # most likely token always stays.
        probs = probs * ((torch.cumsum(probs, dim=-1) - probs) < top_p[:, None])
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1:]
    target = torch.minimum(uniform[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    # The first index whose cdf passes the target: a token of zero mass has cdf equal to its predecessor's, so it
    # is never the first to pass.
    idx = torch.searchsorted(cdf, target, right=True).clamp_(max=vocab - 1)
    sampled = order.gather(1, idx)[:, 0] if truncate else idx[:, 0]
    tokens = torch.where(greedy, logits.argmax(dim=-1), sampled)
    logprobs = logits.gather(1, tokens[:, None])[:, 0] - raw_lse
    return tokens, logprobs
