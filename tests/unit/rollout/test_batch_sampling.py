"""Batched sampling (`rollout.engine.batch_sampling`): per-row parameters, raw log-probs, seeded streams."""

from __future__ import annotations

import math

import pytest
import torch

from rollout.engine.batch_sampling import sample_rows, seeded_uniform

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0])


def rows(n: int, *, temp: float = 1.0, k: int = 0, p: float = 1.0, u: list[float] | None = None):
    return (LOGITS.repeat(n, 1), torch.full((n,), temp), torch.full((n,), k, dtype=torch.long), torch.full((n,), p),
            torch.tensor(u if u is not None else [seeded_uniform(7, i) for i in range(n)]))


def test_greedy_rows_take_the_argmax_and_every_row_returns_the_raw_logprob() -> None:
    raw = torch.log_softmax(LOGITS, -1)
    logits, temp, k, p, u = rows(3, temp=0.0)
    tok, lp = sample_rows(logits, temp, k, p, u, truncate=False)
    assert tok.tolist() == [0, 0, 0] and torch.allclose(lp, raw[0].expand(3))
    logits, temp, k, p, u = rows(400, temp=5.0)
    tok, lp = sample_rows(logits, temp, k, p, u, truncate=False)
    assert torch.allclose(lp, raw[tok])  # not the tempered log-prob


@pytest.mark.parametrize("truncate", [False, True])
def test_sampled_frequencies_follow_the_tempered_distribution(truncate: bool) -> None:
    n = 20_000
    logits, temp, k, p, u = rows(n, temp=2.0)
    tok, _ = sample_rows(logits, temp, k, p, u, truncate=truncate)
    want = torch.softmax(LOGITS / 2.0, -1)
    got = torch.bincount(tok, minlength=4).float() / n
    assert (got - want).abs().max().item() < 4 * math.sqrt(0.25 / n)


def test_top_k_and_top_p_truncate_per_row() -> None:
    n = 3000
    logits, temp, k, p, u = rows(n, temp=5.0)
    k[: n // 3] = 2  # rows 0..999: top-2
    p[n // 3 : 2 * n // 3] = 0.01  # rows 1000..1999: the most likely token only
    tok, _ = sample_rows(logits, temp, k, p, u, truncate=True)
    assert set(tok[: n // 3].tolist()) == {0, 1}
    assert set(tok[n // 3 : 2 * n // 3].tolist()) == {0}
    assert set(tok[2 * n // 3 :].tolist()) == {0, 1, 2, 3}  # untouched rows sample the whole vocabulary


def test_a_zero_mass_token_is_never_sampled_even_at_the_top_of_the_range() -> None:
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).repeat(2, 1)
    u = torch.tensor([0.0, (2**24 - 1) / 2**24])
    tok, _ = sample_rows(logits, torch.ones(2), torch.zeros(2, dtype=torch.long), torch.ones(2), u, truncate=False)
    assert tok.tolist() == [0, 2]


def test_seeded_uniforms_are_a_stream_per_seed_in_unit_range() -> None:
    a = [seeded_uniform(1, i) for i in range(1000)]
    assert a == [seeded_uniform(1, i) for i in range(1000)]
    assert a != [seeded_uniform(2, i) for i in range(1000)]
    assert all(0.0 <= x < 1.0 for x in a) and 0.45 < sum(a) / len(a) < 0.55
    assert len(set(a)) > 990
