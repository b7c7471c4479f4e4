"""GRPO math checked against an independent float64 reference.

The reference below is written per element with plain Python over nested lists (``math``, ``statistics``), straight
from the definitions in REFERENCE.md / NeMo RL, and never calls the vectorised module code. ``statistics.stdev``
uses exact rational arithmetic, so the reference's "std > 0" test is exact.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fleet.config.algorithm import LossConfig
from trainer.grpo import compute_advantages, count_valid, grpo_loss

Matrix = list[list[float]]

# ----------------------------------------------------------------------------------------------------------------
# Reference implementation
# ----------------------------------------------------------------------------------------------------------------


def ref_advantages(rewards: Matrix, leave_one_out: bool, normalize: bool) -> Matrix:
    out = []
    for group in rewards:
        row = []
        for i, r in enumerate(group):
            if len(group) == 1:
                row.append(0.0)
                continue
            pool = group[:i] + group[i + 1 :] if leave_one_out else group
            baseline = statistics.fmean(pool)
            std = statistics.stdev(pool) if len(pool) >= 2 else 0.0
            a = r - baseline
            if normalize and std > 0:
                a = a / (std + 1e-6)
            row.append(a)
        out.append(row)
    return out


def _exp_or_zero(x: float) -> float:
    """exp, with the loss's rule that a non-finite IS weight counts as 0."""
    try:
        return math.exp(x)
    except OverflowError:
        return 0.0


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def ref_token_terms(lp: Matrix, old: Matrix, gen: Matrix, adv: list, mask: Matrix, cfg: LossConfig,
                    ref: Matrix | None) -> list[dict[tuple[int, int], dict[str, float]]]:
    """Per valid token: loss term, its pieces and flags, and d(term)/d(logprob) for token-level ratios."""
    rows = []
    for b in range(len(lp)):
        valid = [t for t in range(len(lp[b])) if mask[b][t] != 0]
        n = len(valid)
        seq_log_ratio = sum(lp[b][t] - old[b][t] for t in valid) / n if n else 0.0
        seq_w = _exp_or_zero(sum(old[b][t] - gen[b][t] for t in valid))
        geo_w = math.exp(sum(old[b][t] - gen[b][t] for t in valid) / n) if n else 1.0
        terms = {}
        for t in valid:
            a = adv[b] if not isinstance(adv[b], list) else adv[b][t]
            r = math.exp(seq_log_ratio) if cfg.sequence_level_importance_ratios else math.exp(lp[b][t] - old[b][t])
            l_unclipped = -a * r
            l_clipped = -a * _clamp(r, 1 - cfg.ratio_clip_min, 1 + cfg.ratio_clip_max)
            clipped = l_clipped > l_unclipped
            pg = max(l_unclipped, l_clipped)
            dual = False
            if cfg.ratio_clip_c is not None and a < 0 and -a * cfg.ratio_clip_c < pg:
                pg, dual = -a * cfg.ratio_clip_c, True
            d_pg = 0.0 if (clipped or dual) else -a * r  # d(-A r)/d logprob for a per-token ratio
            w_raw = seq_w if cfg.sequence_level_importance_ratios else _exp_or_zero(old[b][t] - gen[b][t])
            w, out_of_bounds = ref_truncate(w_raw, geo_w, cfg)
            w_truncated = w
            if not cfg.use_importance_sampling_correction:
                w = 1.0
            k3 = d_k3 = score = 0.0
            beta = cfg.reference_policy_kl_penalty
            if beta != 0:
                assert ref is not None
                log_r_raw = ref[b][t] - lp[b][t]
                log_r = _clamp(log_r_raw, -20.0, 20.0)
                k3_raw = math.exp(log_r) - 1 - log_r
                k3 = _clamp(k3_raw, -10.0, 10.0)
                if abs(log_r_raw) > 20 or abs(k3_raw) > 10:
                    d_k3 = 0.0  # a clamp is active: no gradient, the score-function factor's included
                elif cfg.kl_score_function_gradient:
                    # d/dlp [exp(lp - sg(lp)) * k3] = k3 + dk3/dlp = (e^r - 1 - r) + (1 - e^r) = -r, r = ref - lp
                    score = k3_raw
                    d_k3 = score + (1 - math.exp(log_r))
                else:
                    d_k3 = 1 - math.exp(log_r)
            terms[(b, t)] = {
                "term": w * pg + beta * k3, "pg_term": w * pg, "k3": k3, "clipped": float(clipped),
                "dual": float(dual), "oob": float(out_of_bounds), "w_raw": w_raw, "w_truncated": w_truncated,
                "grad": w * d_pg + beta * d_k3, "kl_score_grad": beta * score,
                "tmpe": math.exp(abs(old[b][t] - gen[b][t])),
            }
        rows.append(terms)
    return rows


def ref_truncate(w_raw: float, geo_w: float, cfg: LossConfig) -> tuple[float, bool]:
    """A token's weight after truncation, and whether it (its sequence, for seq-mask-tis) is out of bounds."""
    kind = cfg.truncated_importance_sampling_type
    hi = cfg.truncated_importance_sampling_ratio or math.inf
    lo = cfg.truncated_importance_sampling_ratio_min or 0.0
    if kind == "tis":
        floor = lo if cfg.tis_clamps_below else 0.0
        return min(max(w_raw, floor), hi), not floor <= w_raw <= hi
    if kind == "icepop":
        inside = lo <= w_raw <= hi
        return (w_raw if inside else 0.0), not inside
    if kind == "seq-mask-tis":
        inside = lo <= geo_w <= hi
        return (w_raw if inside else 0.0), not inside
    return w_raw, False


def ref_loss(lp: Matrix, old: Matrix, gen: Matrix, adv: list, mask: Matrix, cfg: LossConfig,
             ref: Matrix | None = None, n_tok: int | None = None, n_seq: int | None = None) -> dict[str, float]:
    rows = ref_token_terms(lp, old, gen, adv, mask, cfg, ref)
    n_tok = max(sum(len(r) for r in rows) if n_tok is None else n_tok, 1)
    n_seq = max(sum(1 for r in rows if r) if n_seq is None else n_seq, 1)

    def reduce(key: str) -> float:
        if cfg.token_level_loss:
            return sum(v[key] for r in rows for v in r.values()) / n_tok
        return sum(sum(v[key] for v in r.values()) / len(r) for r in rows if r) / n_seq

    if cfg.sequence_level_importance_ratios:
        firsts = [next(iter(r.values())) for r in rows if r]
        ratio_norm = n_seq
    else:
        firsts = [v for r in rows for v in r.values()]
        ratio_norm = n_tok
    ratios = [v["w_raw"] for v in firsts]
    token_mean = {k: sum(v[k] for r in rows for v in r.values()) / n_tok for k in ("clipped", "dual", "oob", "tmpe")}
    if cfg.truncated_importance_sampling_type == "seq-mask-tis":  # NeMo counts sequences here, tokens otherwise
        oob = sum(next(iter(r.values()))["oob"] for r in rows if r) / n_seq
    else:
        oob = token_mean["oob"]
    return {
        "loss": reduce("term"), "pg_loss": reduce("pg_term"), "kl": reduce("k3"),
        "clip_fraction": token_mean["clipped"], "dual_clip_fraction": token_mean["dual"],
        "is_oob_ratio": oob, "token_mult_prob_error": token_mean["tmpe"],
        "sampling_importance_ratio": sum(v["w_truncated"] for v in firsts) / ratio_norm,
        "is_ratio_min": min(ratios, default=math.inf), "is_ratio_max": max(ratios, default=-math.inf),
    }


def ref_grad(lp: Matrix, old: Matrix, gen: Matrix, adv: list, mask: Matrix, cfg: LossConfig,
             ref: Matrix | None = None, key: str = "grad") -> Matrix:
    """Analytic d loss / d logprobs for per-token ratios (the GSPO ratio is checked by finite differences).

    ``key="kl_score_grad"`` gives the KL's score-function part alone: a surrogate gradient, which finite
    differences of the loss value cannot see (the factor it comes from has value 1)."""
    assert key != "grad" or not cfg.sequence_level_importance_ratios
    rows = ref_token_terms(lp, old, gen, adv, mask, cfg, ref)
    n_tok = max(sum(len(r) for r in rows), 1)
    n_seq = max(sum(1 for r in rows if r), 1)
    grad = [[0.0] * len(lp[0]) for _ in lp]
    for b, r in enumerate(rows):
        for (_, t), v in r.items():
            grad[b][t] = v[key] / (n_tok if cfg.token_level_loss else len(r) * n_seq)
    return grad


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------

F64 = torch.float64


def replace(cfg: LossConfig, **changes: Any) -> LossConfig:
    """A validated copy (pydantic's model_copy(update=...) would skip the validators)."""
    return LossConfig(**{**cfg.model_dump(), **changes})


TOKEN_IS = LossConfig(use_importance_sampling_correction=True)
CONFIGS = [
    LossConfig(),
    LossConfig(reference_policy_kl_penalty=0.0),
    LossConfig(ratio_clip_min=0.1, ratio_clip_max=0.28, ratio_clip_c=3.0, reference_policy_kl_penalty=0.1),
    TOKEN_IS,
    replace(TOKEN_IS, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0),
    replace(TOKEN_IS, truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=2.0,
            truncated_importance_sampling_ratio_min=0.5),
    replace(TOKEN_IS, truncated_importance_sampling_type="seq-mask-tis", truncated_importance_sampling_ratio=1.5,
            truncated_importance_sampling_ratio_min=0.7, token_level_loss=False),
    replace(TOKEN_IS, sequence_level_importance_ratios=True, token_level_loss=False, ratio_clip_c=2.0),
    replace(TOKEN_IS, sequence_level_importance_ratios=True, token_level_loss=False,
            truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=3.0,
            truncated_importance_sampling_ratio_min=0.3),
    LossConfig(token_level_loss=False, ratio_clip_c=1.5),
    # NeMo RL's current tis clamps from below too; the old cap-only tis and the old KL gradient stay selectable.
    replace(TOKEN_IS, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0,
            truncated_importance_sampling_ratio_min=0.6),
    replace(TOKEN_IS, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0,
            truncated_importance_sampling_ratio_min=0.6, tis_clamps_below=False),
    LossConfig(reference_policy_kl_penalty=0.2, kl_score_function_gradient=False),
    replace(TOKEN_IS, sequence_level_importance_ratios=True, token_level_loss=False, reference_policy_kl_penalty=0.1,
            truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=1.5,
            truncated_importance_sampling_ratio_min=0.8),
]


def run_loss(lp: Matrix, old: Matrix, gen: Matrix, adv: list, mask: Matrix, cfg: LossConfig,
             ref: Matrix | None = None, dtype: torch.dtype = F64) -> tuple[torch.Tensor, dict, torch.Tensor]:
    logprobs = torch.tensor(lp, dtype=dtype, requires_grad=True)
    mask_t = torch.tensor(mask, dtype=dtype)
    n_tok, n_seq = count_valid(mask_t)
    loss, metrics = grpo_loss(
        logprobs, torch.tensor(old, dtype=dtype), torch.tensor(gen, dtype=dtype), torch.tensor(adv, dtype=dtype),
        mask_t, cfg, global_valid_tokens=n_tok, global_valid_seqs=n_seq,
        reference_logprobs=None if ref is None else torch.tensor(ref, dtype=dtype),
    )
    loss.backward()
    assert logprobs.grad is not None
    return loss, metrics, logprobs.grad


def assert_matches_reference(got: tuple[torch.Tensor, dict, torch.Tensor], want: dict[str, float],
                             rel: float = 1e-9, abs_: float = 1e-12) -> None:
    loss, metrics, _ = got
    assert loss.item() == pytest.approx(want["loss"], rel=rel, abs=abs_)
    for key, value in want.items():
        assert metrics[key].item() == pytest.approx(value, rel=rel, abs=abs_), key


def assert_close(got: Matrix, want: Matrix, rel: float = 1e-9, abs_: float = 1e-12) -> None:
    assert len(got) == len(want)
    for got_row, want_row in zip(got, want, strict=True):
        assert got_row == pytest.approx(want_row, rel=rel, abs=abs_)


def random_batch(seed: int, b: int, t: int, spread: float, per_token_adv: bool = False) -> dict:
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(b, t, generator=g, dtype=F64) * 5
    old = lp + (torch.rand(b, t, generator=g, dtype=F64) * 2 - 1) * spread
    gen = old + (torch.rand(b, t, generator=g, dtype=F64) * 2 - 1) * spread
    ref = lp + (torch.rand(b, t, generator=g, dtype=F64) * 2 - 1) * spread
    mask = (torch.rand(b, t, generator=g) < 0.75).to(F64)
    mask[0] = 0.0  # a fully masked row
    mask[1, 0] = 1.0
    shape = (b, t) if per_token_adv else (b,)
    adv = torch.randn(*shape, generator=g, dtype=F64) * 2
    return {"lp": lp.tolist(), "old": old.tolist(), "gen": gen.tolist(), "ref": ref.tolist(),
            "mask": mask.tolist(), "adv": adv.tolist()}


def check_batch(batch: dict, cfg: LossConfig, **tol: float) -> tuple[torch.Tensor, dict, torch.Tensor]:
    args = (batch["lp"], batch["old"], batch["gen"], batch["adv"], batch["mask"], cfg, batch["ref"])
    got = run_loss(*args)
    assert_matches_reference(got, ref_loss(*args), **tol)
    return got


# ----------------------------------------------------------------------------------------------------------------
# Advantages
# ----------------------------------------------------------------------------------------------------------------

reward_values = st.one_of(st.sampled_from([0.0, 0.5, 1.0, -1.0]),
                          st.floats(-10, 10, allow_nan=False, allow_subnormal=False))
# Where a pool's true std is far below the rewards' ulp (e.g. others {0, 0, 1e-45}), NeMo's rule divides by
# (std + 1e-6) and so amplifies the float std's ulp-level error: ~ulp(10) / 1e-6 ~ 2e-9 relative, hence 1e-7.
ADV_REL = 1e-7
reward_groups = st.integers(1, 9).flatmap(
    lambda g: st.lists(st.lists(reward_values, min_size=g, max_size=g), min_size=1, max_size=5))


@settings(max_examples=300, deadline=None)
@given(rewards=reward_groups, normalize=st.booleans())
def test_leave_one_out_advantage_matches_reference(rewards: Matrix, normalize: bool) -> None:
    got = compute_advantages(torch.tensor(rewards, dtype=F64), leave_one_out=True, normalize=normalize)
    want = ref_advantages(rewards, leave_one_out=True, normalize=normalize)
    assert_close(got.tolist(), want, rel=ADV_REL, abs_=1e-9)


@settings(max_examples=300, deadline=None)
@given(rewards=reward_groups, normalize=st.booleans())
def test_group_mean_advantage_matches_reference(rewards: Matrix, normalize: bool) -> None:
    got = compute_advantages(torch.tensor(rewards, dtype=F64), leave_one_out=False, normalize=normalize)
    want = ref_advantages(rewards, leave_one_out=False, normalize=normalize)
    assert_close(got.tolist(), want, rel=ADV_REL, abs_=1e-9)


@settings(max_examples=200, deadline=None)
@given(value=st.floats(-1e6, 1e6, allow_nan=False), group_size=st.integers(1, 16),
       leave_one_out=st.booleans(), normalize=st.booleans(), dtype=st.sampled_from([torch.float32, F64]))
def test_all_equal_reward_groups_give_exactly_zero(value: float, group_size: int, leave_one_out: bool,
                                                   normalize: bool, dtype: torch.dtype) -> None:
    rewards = torch.full((3, group_size), value, dtype=dtype)
    got = compute_advantages(rewards, leave_one_out=leave_one_out, normalize=normalize)
    assert torch.equal(got, torch.zeros_like(rewards))


def test_leave_one_out_binary_rewards_match_hand_computed_values() -> None:
    got = compute_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=F64), leave_one_out=True, normalize=True)
    # r_0: the others are all 0, std 0, so A = 1 unscaled; r_j: others {1, 0, 0}, mean 1/3, Bessel std sqrt(1/3).
    other = -(1 / 3) / (math.sqrt(1 / 3) + 1e-6)
    assert_close(got.tolist(), [[1.0, other, other, other]], rel=1e-12)


def test_group_mean_binary_rewards_match_hand_computed_values() -> None:
    got = compute_advantages(torch.tensor([[1, 0, 0, 0]]), leave_one_out=False, normalize=True)
    # mean 1/4, Bessel std sqrt((9/16 + 3/16) / 3) = 1/2; integer rewards come back as float32.
    assert got.dtype == torch.float32
    assert_close(got.tolist(), [[0.75 / (0.5 + 1e-6)] + [-0.25 / (0.5 + 1e-6)] * 3], rel=1e-6)


def test_equal_others_count_as_zero_std_despite_rounded_mean() -> None:
    # The others of r_0 are three equal 0.1s, whose float mean is not exactly 0.1: the std must still be 0.
    got = compute_advantages(torch.tensor([[0.0, 0.1, 0.1, 0.1]], dtype=F64), leave_one_out=True, normalize=True)
    assert got[0, 0].item() == pytest.approx(-0.1, rel=1e-12)


@pytest.mark.parametrize("normalize", [False, True])
def test_group_of_two_leave_one_out_is_plain_difference(normalize: bool) -> None:
    got = compute_advantages(torch.tensor([[1.0, 0.25], [3.0, 3.0]], dtype=F64), leave_one_out=True,
                             normalize=normalize)
    assert got.tolist() == [[0.75, -0.75], [0.0, 0.0]]


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_single_response_group_has_zero_advantage(leave_one_out: bool) -> None:
    got = compute_advantages(torch.tensor([[5.0], [-2.0]]), leave_one_out=leave_one_out, normalize=True)
    assert got.tolist() == [[0.0], [0.0]]


@pytest.mark.parametrize("bad", [torch.zeros(4), torch.zeros(2, 3, 1)])
def test_advantages_reject_rewards_that_are_not_a_group_matrix(bad: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="rewards must have shape"):
        compute_advantages(bad, leave_one_out=True, normalize=True)


# ----------------------------------------------------------------------------------------------------------------
# Loss against the reference
# ----------------------------------------------------------------------------------------------------------------


@st.composite
def loss_cases(draw: st.DrawFn) -> tuple:
    b, t = draw(st.integers(1, 4)), draw(st.integers(1, 6))

    def matrix(elements: st.SearchStrategy[float]) -> Matrix:
        flat = draw(st.lists(elements, min_size=b * t, max_size=b * t))
        return [flat[i * t : (i + 1) * t] for i in range(b)]

    delta = st.floats(-1.5, 1.5, allow_nan=False, allow_subnormal=False)
    lp = matrix(st.floats(-8, 0, allow_nan=False, allow_subnormal=False))
    old = [[x + d for x, d in zip(row, drow, strict=True)] for row, drow in zip(lp, matrix(delta), strict=True)]
    gen = [[x + d for x, d in zip(row, drow, strict=True)] for row, drow in zip(old, matrix(delta), strict=True)]
    ref = [[x + 3 * d for x, d in zip(row, drow, strict=True)] for row, drow in zip(lp, matrix(delta), strict=True)]
    mask = matrix(st.sampled_from([0.0, 1.0]))
    adv_value = st.floats(-3, 3, allow_nan=False, allow_subnormal=False)
    adv = matrix(adv_value) if draw(st.booleans()) else draw(st.lists(adv_value, min_size=b, max_size=b))
    return lp, old, gen, adv, mask, draw(st.sampled_from(CONFIGS)), ref


@settings(max_examples=300, deadline=None)
@given(case=loss_cases())
def test_loss_and_metrics_match_reference_for_every_config(case: tuple) -> None:
    got = run_loss(*case)
    assert_matches_reference(got, ref_loss(*case))
    lp, old, gen, adv, mask, cfg, ref = case
    if not cfg.sequence_level_importance_ratios:
        assert_close(got[2].tolist(), ref_grad(*case))


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_seeded_batches_match_reference(cfg: LossConfig, per_token_adv: bool) -> None:
    for seed in range(3):
        check_batch(random_batch(seed, 5, 17, spread=0.6, per_token_adv=per_token_adv), cfg)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_extreme_log_ratios_stay_finite_and_match_reference(cfg: LossConfig) -> None:
    batch = random_batch(7, 6, 12, spread=30.0)
    loss, metrics, grad = check_batch(batch, cfg)
    assert math.isfinite(loss.item()) and bool(torch.isfinite(grad).all())
    # The same batch in float32 (the training precision) agrees with the float64 reference.
    want = ref_loss(batch["lp"], batch["old"], batch["gen"], batch["adv"], batch["mask"], cfg, batch["ref"])
    got32 = run_loss(batch["lp"], batch["old"], batch["gen"], batch["adv"], batch["mask"], cfg, batch["ref"],
                     dtype=torch.float32)
    if not cfg.sequence_level_importance_ratios:  # exp(sum of 30s) overflows at a lower threshold in float32
        assert got32[0].item() == pytest.approx(want["loss"], rel=1e-4, abs=1e-5)


def test_overflowing_sequence_level_weight_drops_the_sequence() -> None:
    cfg = replace(TOKEN_IS, sequence_level_importance_ratios=True, token_level_loss=False)
    lp = [[-1.0] * 40, [-1.0] * 40]
    old = [[-1.1] * 40, [-1.1] * 40]
    gen = [[-30.0] * 40, [-1.2] * 40]  # row 0: exp(40 * 28.9) overflows
    args = (lp, old, gen, [1.0, 1.0], [[1.0] * 40] * 2, cfg, [[-1.0] * 40] * 2)
    loss, metrics, grad = run_loss(*args)
    assert_matches_reference((loss, metrics, grad), ref_loss(*args))
    assert torch.all(grad[0] == 0) and torch.all(grad[1] != 0)


def test_gspo_gradient_matches_finite_differences_of_reference() -> None:
    cfg = replace(TOKEN_IS, sequence_level_importance_ratios=True, token_level_loss=False,
                  reference_policy_kl_penalty=0.05)
    batch = random_batch(3, 4, 6, spread=0.15)
    rest = (batch["old"], batch["gen"], batch["adv"], batch["mask"], cfg, batch["ref"])
    _, _, grad = run_loss(batch["lp"], *rest)
    score = ref_grad(batch["lp"], *rest, key="kl_score_grad")
    h = 1e-6
    for b in range(4):
        for t in range(6):
            up = [row[:] for row in batch["lp"]]
            down = [row[:] for row in batch["lp"]]
            up[b][t] += h
            down[b][t] -= h
            numeric = (ref_loss(up, *rest)["loss"] - ref_loss(down, *rest)["loss"]) / (2 * h) + score[b][t]
            assert grad[b][t].item() == pytest.approx(numeric, rel=1e-5, abs=1e-8), (b, t)


@pytest.mark.parametrize("cfg", [CONFIGS[2], CONFIGS[5], CONFIGS[9]])
def test_token_ratio_gradient_matches_analytic_reference(cfg: LossConfig) -> None:
    batch = random_batch(11, 6, 9, spread=0.5, per_token_adv=True)
    args = (batch["lp"], batch["old"], batch["gen"], batch["adv"], batch["mask"], cfg, batch["ref"])
    _, _, grad = run_loss(*args)
    assert_close(grad.tolist(), ref_grad(*args))


# ----------------------------------------------------------------------------------------------------------------
# Behaviours, one at a time
# ----------------------------------------------------------------------------------------------------------------


def one_row(ws: list[float], cfg: LossConfig, adv: float = 1.0) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """A single sequence with ratio 1 (logprobs == old) and IS weights ``ws``; no KL."""
    lp = [[-1.0] * len(ws)]
    gen = [[-1.0 - math.log(w) for w in ws]]
    return run_loss(lp, lp, gen, [adv], [[1.0] * len(ws)], replace(cfg, reference_policy_kl_penalty=0.0))


TIS = replace(TOKEN_IS, truncated_importance_sampling_type="tis", truncated_importance_sampling_ratio=2.0,
              truncated_importance_sampling_ratio_min=0.5)


def test_tis_clamps_weights_to_both_bounds_like_current_nemo() -> None:
    loss, metrics, grad = one_row([0.1, 1.0, 1.5, 4.0], TIS)
    # With ratio 1 and A = 1, d loss / d logprob_t = -w_t / 4: 0.1 -> 0.5 (the lower clamp), 4 -> 2.
    assert grad[0].tolist() == pytest.approx([-0.5 / 4, -1.0 / 4, -1.5 / 4, -2.0 / 4], rel=1e-12)
    assert metrics["is_oob_ratio"].item() == pytest.approx(0.5)
    assert metrics["sampling_importance_ratio"].item() == pytest.approx((0.5 + 1.0 + 1.5 + 2.0) / 4, rel=1e-12)
    assert metrics["is_ratio_min"].item() == pytest.approx(0.1)  # the range is reported before truncation
    assert metrics["is_ratio_max"].item() == pytest.approx(4.0)


def test_tis_without_lower_clamp_only_caps_weights_like_earlier_nemo() -> None:
    loss, metrics, grad = one_row([0.1, 1.0, 1.5, 4.0], replace(TIS, tis_clamps_below=False))
    assert grad[0].tolist() == pytest.approx([-0.1 / 4, -1.0 / 4, -1.5 / 4, -2.0 / 4], rel=1e-12)
    assert metrics["is_oob_ratio"].item() == pytest.approx(0.25)


def test_tis_lower_bound_defaults_to_zero() -> None:
    cfg = replace(TIS, truncated_importance_sampling_ratio_min=None)
    loss, metrics, grad = one_row([0.1, 4.0], cfg)
    assert grad[0].tolist() == pytest.approx([-0.1 / 2, -2.0 / 2], rel=1e-12)
    assert metrics["is_oob_ratio"].item() == pytest.approx(0.5)


def test_icepop_zeroes_tokens_outside_bounds() -> None:
    cfg = replace(TOKEN_IS, truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=2.0,
                  truncated_importance_sampling_ratio_min=0.5)
    loss, metrics, grad = one_row([0.4, 0.5, 1.3, 2.0, 2.1], cfg)
    assert grad[0].tolist() == pytest.approx([0.0, -0.5 / 5, -1.3 / 5, -2.0 / 5, 0.0], rel=1e-12)
    assert loss.item() == pytest.approx(-(0.5 + 1.3 + 2.0) / 5, rel=1e-12)
    assert metrics["is_oob_ratio"].item() == pytest.approx(0.4)
    assert metrics["sampling_importance_ratio"].item() == pytest.approx((0.5 + 1.3 + 2.0) / 5, rel=1e-12)


def test_seq_mask_tis_zeroes_sequences_by_geometric_mean_and_keeps_token_weights() -> None:
    cfg = replace(TOKEN_IS, truncated_importance_sampling_type="seq-mask-tis",
                  truncated_importance_sampling_ratio=1.5, truncated_importance_sampling_ratio_min=0.7)
    # Geometric means: row 0 sqrt(0.5 * 4) = 1.41 (kept, and its 4.0 token keeps weight 4), row 1 (one token) 4.
    lp = [[-1.0, -1.0], [-1.0, -1.0]]
    gen = [[-1.0 - math.log(0.5), -1.0 - math.log(4.0)], [-1.0 - math.log(4.0), -1.0]]
    cfg = replace(cfg, reference_policy_kl_penalty=0.0)
    loss, metrics, grad = run_loss(lp, lp, gen, [1.0, 1.0], [[1.0, 1.0], [1.0, 0.0]], cfg)
    assert grad.tolist()[0] == pytest.approx([-0.5 / 3, -4.0 / 3], rel=1e-12)
    assert grad.tolist()[1] == [0.0, 0.0]
    # NeMo counts sequences for seq-mask-tis: 1 of 2 (1 of 3 tokens would be the token count).
    assert metrics["is_oob_ratio"].item() == pytest.approx(0.5)
    assert metrics["sampling_importance_ratio"].item() == pytest.approx((0.5 + 4.0) / 3, rel=1e-12)


def test_dual_clip_bounds_the_loss_of_negative_advantages() -> None:
    cfg = LossConfig(ratio_clip_c=3.0, reference_policy_kl_penalty=0.0)
    lp = [[math.log(5.0), math.log(2.0), math.log(5.0)]]  # ratios 5, 2, 5 against old = 0
    old = [[0.0, 0.0, 0.0]]
    adv = [[-1.0, -1.0, 1.0]]
    loss, metrics, grad = run_loss(lp, old, old, adv, [[1.0, 1.0, 1.0]], cfg)
    # A = -1, r = 5: max(5, 1.2) = 5, capped at c = 3. A = -1, r = 2: 2 < 3, unchanged. A = +1, r = 5: clipped to -1.2.
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3, rel=1e-12)
    assert grad[0].tolist() == pytest.approx([0.0, 2.0 / 3, 0.0], rel=1e-12)
    assert metrics["dual_clip_fraction"].item() == pytest.approx(1 / 3)
    assert metrics["clip_fraction"].item() == pytest.approx(1 / 3)


def test_sequence_level_loss_weights_sequences_equally_and_token_level_weights_tokens() -> None:
    lp = [[-1.0, -1.0, -1.0, -1.0], [-1.0, -1.0, -1.0, -1.0]]
    mask = [[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]]
    adv = [1.0, -2.0]  # ratio 1, so the per-token loss is -A
    token = run_loss(lp, lp, lp, adv, mask, LossConfig(reference_policy_kl_penalty=0.0))[0]
    seq = run_loss(lp, lp, lp, adv, mask, LossConfig(reference_policy_kl_penalty=0.0, token_level_loss=False))[0]
    assert token.item() == pytest.approx((-1.0 * 4 + 2.0) / 5, rel=1e-12)
    assert seq.item() == pytest.approx((-1.0 + 2.0) / 2, rel=1e-12)


def test_sequence_level_importance_weight_is_the_product_of_token_ratios() -> None:
    cfg = replace(TOKEN_IS, sequence_level_importance_ratios=True, token_level_loss=False,
                  reference_policy_kl_penalty=0.0)
    lp = [[-1.0, -1.0, -1.0]]
    gen = [[-1.0 - math.log(2.0), -1.0 - math.log(0.25), -1.0 - math.log(3.0)]]
    loss, metrics, _ = run_loss(lp, lp, gen, [1.0], [[1.0, 1.0, 1.0]], cfg)
    assert metrics["sampling_importance_ratio"].item() == pytest.approx(1.5, rel=1e-12)
    assert loss.item() == pytest.approx(-1.5, rel=1e-12)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_micro_batch_split_sums_to_the_full_batch_loss_gradient_and_metrics(cfg: LossConfig) -> None:
    batch = random_batch(5, 7, 11, spread=0.7)
    t = {k: torch.tensor(v, dtype=F64) for k, v in batch.items()}
    n_tok, n_seq = count_valid(t["mask"])

    def loss_of(rows: slice, logprobs: torch.Tensor) -> tuple[torch.Tensor, dict]:
        return grpo_loss(logprobs[rows], t["old"][rows], t["gen"][rows], t["adv"][rows], t["mask"][rows], cfg,
                         global_valid_tokens=n_tok, global_valid_seqs=n_seq, reference_logprobs=t["ref"][rows])

    full_lp = t["lp"].clone().requires_grad_(True)
    full, full_metrics = loss_of(slice(None), full_lp)
    full.backward()
    split_lp = t["lp"].clone().requires_grad_(True)
    parts = [loss_of(slice(0, 3), split_lp), loss_of(slice(3, 7), split_lp)]
    (parts[0][0] + parts[1][0]).backward()

    assert (parts[0][0] + parts[1][0]).item() == pytest.approx(full.item(), rel=1e-12, abs=1e-15)
    assert split_lp.grad is not None and full_lp.grad is not None
    assert torch.allclose(split_lp.grad, full_lp.grad, rtol=1e-12, atol=1e-15)
    for key in ("pg_loss", "kl", "clip_fraction", "sampling_importance_ratio", "is_oob_ratio",
                "token_mult_prob_error"):
        summed = parts[0][1][key].item() + parts[1][1][key].item()
        assert summed == pytest.approx(full_metrics[key].item(), rel=1e-12, abs=1e-15), key
    assert min(p[1]["is_ratio_min"].item() for p in parts) == full_metrics["is_ratio_min"].item()


@pytest.mark.parametrize("cfg", CONFIGS)
def test_padding_with_inf_and_nan_does_not_leak_into_loss_or_gradient(cfg: LossConfig) -> None:
    batch = random_batch(9, 4, 6, spread=0.5, per_token_adv=True)
    want = ref_loss(batch["lp"], batch["old"], batch["gen"], batch["adv"], batch["mask"], cfg, batch["ref"])
    dirty = {k: [row[:] for row in v] for k, v in batch.items() if k != "mask"}
    for b, row in enumerate(batch["mask"]):
        for t, m in enumerate(row):
            if m == 0:
                dirty["lp"][b][t] = -math.inf
                dirty["old"][b][t] = math.inf
                dirty["gen"][b][t] = math.nan
                dirty["ref"][b][t] = -math.inf
                dirty["adv"][b][t] = math.nan
    got = run_loss(dirty["lp"], dirty["old"], dirty["gen"], dirty["adv"], batch["mask"], cfg, dirty["ref"])
    assert_matches_reference(got, want)
    grad = got[2]
    assert bool(torch.isfinite(grad).all())
    assert bool((grad[torch.tensor(batch["mask"]) == 0] == 0).all())


def test_all_padding_batch_gives_zero_loss_not_nan() -> None:
    loss, metrics, grad = run_loss([[-1.0, -2.0]], [[-1.0, -2.0]], [[-1.0, -2.0]], [1.0], [[0.0, 0.0]], TOKEN_IS,
                                   [[-1.0, -2.0]])
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    assert metrics["is_ratio_min"].item() == math.inf and metrics["is_ratio_max"].item() == -math.inf


def test_kl_term_is_not_importance_weighted() -> None:
    # icepop drops every token's policy-gradient term, but the KL to the reference still applies in full.
    cfg = replace(TOKEN_IS, truncated_importance_sampling_type="icepop", truncated_importance_sampling_ratio=2.0,
                  truncated_importance_sampling_ratio_min=0.5, reference_policy_kl_penalty=0.1)
    lp, ref, gen = [[-1.0, -2.0]], [[-1.5, -1.0]], [[-9.0, -9.0]]
    loss, metrics, _ = run_loss(lp, lp, gen, [1.0], [[1.0, 1.0]], cfg, ref)
    k3 = [math.exp(-0.5) - 1 + 0.5, math.exp(1.0) - 1 - 1.0]
    assert metrics["pg_loss"].item() == 0.0
    assert loss.item() == pytest.approx(0.1 * sum(k3) / 2, rel=1e-12)


def kl_only(lp: list[float], ref: list[float], **kw: Any) -> tuple[torch.Tensor, dict, torch.Tensor]:
    """One sequence with A = 0 (no policy-gradient term) and the KL at beta = 0.1."""
    cfg = LossConfig(reference_policy_kl_penalty=0.1, **kw)
    return run_loss([lp], [lp], [lp], [0.0], [[1.0] * len(lp)], cfg, [ref])


def test_kl_score_function_gradient_is_beta_times_logp_minus_ref_per_token() -> None:
    lp, ref = [-1.0, -2.0, -0.5], [-1.5, -1.0, -0.5]
    k3 = [math.exp(r - x) - 1 - (r - x) for x, r in zip(lp, ref, strict=True)]
    loss, metrics, grad = kl_only(lp, ref)
    # d/dlp [exp(lp - sg(lp)) k3] = k3 + (1 - e^(ref - lp)) = lp - ref.
    assert grad[0].tolist() == pytest.approx([0.1 * (x - r) / 3 for x, r in zip(lp, ref, strict=True)], rel=1e-12)
    assert loss.item() == pytest.approx(0.1 * sum(k3) / 3, rel=1e-12)  # the value is k3's either way
    legacy_loss, legacy_metrics, legacy_grad = kl_only(lp, ref, kl_score_function_gradient=False)
    assert legacy_grad[0].tolist() == pytest.approx(
        [0.1 * (1 - math.exp(r - x)) / 3 for x, r in zip(lp, ref, strict=True)], rel=1e-12)
    assert legacy_loss.item() == loss.item() and legacy_metrics["kl"].item() == metrics["kl"].item()


@pytest.mark.parametrize("score_function", [True, False])
def test_kl_gradient_is_zero_where_a_clamp_is_active(score_function: bool) -> None:
    # Token 1: ref - lp = 25 > 20 (input clamp); token 2: ref - lp = 3, k3 = e^3 - 4 = 16.1 > 10 (output clamp);
    # token 0 is unclamped. With NeMo's clamps (20, 10) an input-clamped token is always output-clamped too
    # (k3(+-20) >= 19), so the factor's detaching there cannot change a gradient; it matters for other clamps.
    lp, ref = [-1.0, -26.0, -4.0], [-1.5, -1.0, -1.0]
    loss, _, grad = kl_only(lp, ref, kl_score_function_gradient=score_function)
    unclamped = 0.1 * (-1.0 + 1.5) / 3 if score_function else 0.1 * (1 - math.exp(-0.5)) / 3
    assert grad[0].tolist() == pytest.approx([unclamped, 0.0, 0.0], rel=1e-12, abs=0.0)
    assert loss.item() == pytest.approx(0.1 * (math.exp(-0.5) - 0.5 + 10.0 + 10.0) / 3, rel=1e-12)


@pytest.mark.parametrize("cfg", [CONFIGS[2], CONFIGS[12]])
def test_extreme_kl_log_ratios_gradient_matches_analytic_reference(cfg: LossConfig) -> None:
    batch = random_batch(13, 6, 12, spread=12.0, per_token_adv=True)  # many tokens beyond both KL clamps
    args = (batch["lp"], batch["old"], batch["gen"], batch["adv"], batch["mask"], cfg, batch["ref"])
    got = run_loss(*args)
    assert_matches_reference(got, ref_loss(*args))
    assert_close(got[2].tolist(), ref_grad(*args))


def test_importance_weights_and_old_logprobs_carry_no_gradient() -> None:
    lp = torch.tensor([[-1.0, -2.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.1, -2.1]], dtype=F64, requires_grad=True)
    gen = torch.tensor([[-1.3, -1.9]], dtype=F64, requires_grad=True)
    loss, _ = grpo_loss(lp, old, gen, torch.tensor([1.0], dtype=F64), torch.ones(1, 2), TOKEN_IS,
                        global_valid_tokens=2, global_valid_seqs=1, reference_logprobs=lp.detach() - 0.1)
    loss.backward()
    assert lp.grad is not None and old.grad is None and gen.grad is None


def test_without_is_correction_weights_are_one_but_ratios_are_reported() -> None:
    loss, metrics, grad = one_row([0.5, 4.0], LossConfig())
    assert grad[0].tolist() == pytest.approx([-0.5, -0.5], rel=1e-12)
    assert metrics["sampling_importance_ratio"].item() == pytest.approx(2.25)
    assert metrics["token_mult_prob_error"].item() == pytest.approx((2.0 + 4.0) / 2)


# ----------------------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------------------


def _inputs(b: int = 2, t: int = 3) -> dict[str, torch.Tensor]:
    return {"logprobs": torch.zeros(b, t), "old_logprobs": torch.zeros(b, t),
            "generation_logprobs": torch.zeros(b, t), "advantages": torch.zeros(b), "mask": torch.ones(b, t)}


@pytest.mark.parametrize(("name", "bad"), [
    ("old_logprobs", torch.zeros(2, 4)),
    ("generation_logprobs", torch.zeros(3, 3)),
    ("mask", torch.ones(2)),
    ("advantages", torch.zeros(3)),
    ("logprobs", torch.zeros(2, 3, 1)),
])
def test_grpo_loss_rejects_mismatched_shapes_naming_the_argument(name: str, bad: torch.Tensor) -> None:
    inputs = _inputs() | {name: bad}
    with pytest.raises(ValueError, match=f"^{name} must"):
        grpo_loss(**inputs, config=LossConfig(reference_policy_kl_penalty=0.0), global_valid_tokens=6,
                  global_valid_seqs=2)


def test_grpo_loss_requires_reference_logprobs_when_kl_is_on() -> None:
    with pytest.raises(ValueError, match="reference_logprobs is required"):
        grpo_loss(**_inputs(), config=LossConfig(), global_valid_tokens=6, global_valid_seqs=2)
    with pytest.raises(ValueError, match="^reference_logprobs must"):
        grpo_loss(**_inputs(), config=LossConfig(), global_valid_tokens=6, global_valid_seqs=2,
                  reference_logprobs=torch.zeros(2, 2))
