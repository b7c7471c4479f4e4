"""Clipped GRPO policy loss with k3 KL and off-policy importance-sampling correction (NeMo RL's ClippedPGLossFn).

All per-token tensors are ``[B, T]`` over response positions; ``mask`` is nonzero on the tokens the loss trains on.

* ratio ``r_t = exp(logp_theta - logp_old)`` (``old_logprobs``: the trainer's own recomputation before the update);
  with ``sequence_level_importance_ratios`` it is the GSPO ratio, ``exp(masked mean_t (logp_theta - logp_old))``,
  shared by every token of the sequence (NeMo switches both the PPO ratio and the IS weight in that mode).
* clipped surrogate ``L = max(-A r, -A clip(r, 1 - ratio_clip_min, 1 + ratio_clip_max))``; dual clip for ``A < 0``:
  ``L = min(L, -A c)``.
* IS weight for staleness and engine mismatch, no gradient: ``w_t = exp(logp_old - logp_gen)`` per token, or per
  sequence ``exp(sum_t (logp_old - logp_gen))`` (the exact sequence likelihood ratio, as NeMo computes it).
  Non-finite weights become 0 (NeMo's ``nan_to_num``): an overflowed sequence is dropped, not allowed to NaN the
  step. Truncation (NeMo RL's current semantics): ``tis`` clamps w to [min (null = 0), max] (``tis_clamps_below=
  false``: the upper cap only, NeMo before); ``icepop`` zeroes tokens with w outside [min, max]; ``seq-mask-tis``
  zeroes whole sequences whose geometric-mean w is outside [min, max] and keeps raw token weights.
* k3 KL to the reference policy: ``logr = clamp(logp_ref - logp_theta, +-20)``, ``k3 = e^logr - 1 - logr``
  clamped to +-10, times ``reference_policy_kl_penalty``. By default (``kl_score_function_gradient``, NeMo RL now)
  it is multiplied by ``exp(logp_theta - sg(logp_theta))``: value unchanged, gradient ``beta (logp_theta -
  logp_ref)`` per token, 0 where either clamp is active; otherwise the gradient of ``beta k3`` alone.
* Metrics under NeMo's names: ``is_oob_ratio`` (tokens out of bounds for tis / icepop, sequences for seq-mask-tis),
  ``sampling_importance_ratio`` (mean weight after truncation), ``token_mult_prob_error``; ours besides them:
  ``is_ratio_min`` / ``is_ratio_max`` of the untruncated weights, ``clip_fraction``, ``dual_clip_fraction``.

Global normalisation: the token-level loss is ``sum(mask * (w L + beta k3)) / global_valid_tokens``, the
sequence-level loss ``sum_b masked_mean_t(w L + beta k3) / global_valid_seqs``, where the normalisers count the
whole optimizer-step batch across micro-batches and data-parallel ranks (``count_valid`` per piece, then summed /
all-reduced). Each piece's loss is then its exact share of the big-batch loss, so summing gradients over
micro-batches and ranks (no averaging) gives the gradient of one big batch. A local mean would weight a short
micro-batch's tokens more than a long one's. Metrics follow the same rule: the mean-like ones are partial sums that
add up over pieces; ``is_ratio_min``/``is_ratio_max`` are local and reduce by min/max (+-inf when empty).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:  # the loss reads its section duck-typed: the lent GPU machines run the step without pydantic
    from fleet.config.algorithm import TruncationType

__all__ = ["LossSettings", "count_valid", "grpo_loss"]

# NeMo RL's defaults for kl_input_clamp_value / kl_output_clamp_value: exp(20) is finite in float32 and the
# clamped k3 stays bounded for tokens the reference finds impossible.
KL_LOG_RATIO_CLAMP = 20.0
KL_VALUE_CLAMP = 10.0


class LossSettings(Protocol):
    """What the loss reads of its config: `fleet.config.algorithm.LossConfig` (the `loss_fn.*` section), which
    validates every rule these formulas rely on. Nothing is re-checked here."""

    ratio_clip_min: float
    ratio_clip_max: float
    ratio_clip_c: float | None
    reference_policy_kl_penalty: float
    kl_score_function_gradient: bool
    use_importance_sampling_correction: bool
    truncated_importance_sampling_type: TruncationType | None
    truncated_importance_sampling_ratio: float | None
    truncated_importance_sampling_ratio_min: float | None
    tis_clamps_below: bool
    sequence_level_importance_ratios: bool
    token_level_loss: bool


def count_valid(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid tokens and valid sequences (rows with at least one valid token) of ``mask`` ``[B, T]``.

    Sum these over micro-batches (and all-reduce over ranks) to get ``grpo_loss``'s global normalisers.
    """
    valid = mask != 0
    return valid.sum(), valid.any(dim=-1).sum()


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossSettings,
    *,
    global_valid_tokens: float | torch.Tensor,
    global_valid_seqs: float | torch.Tensor,
    reference_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Return this micro-batch's share of the GRPO loss (a 0-dim tensor with grad) and detached 0-dim metrics."""
    _check_inputs(logprobs, old_logprobs, generation_logprobs, advantages, mask, reference_logprobs)
    beta = config.reference_policy_kl_penalty
    if beta != 0 and reference_logprobs is None:
        raise ValueError("reference_logprobs is required when loss_fn.reference_policy_kl_penalty != 0")
    # Loss arithmetic in at least float32, like NeMo, whatever precision the model ran in.
    dtype = torch.promote_types(logprobs.dtype, torch.float32)
    valid = mask != 0
    m = valid.to(dtype)
    n_tok = _normaliser(global_valid_tokens, "global_valid_tokens", m)
    n_seq = _normaliser(global_valid_seqs, "global_valid_seqs", m)

    # Padding may hold -inf or garbage. Zero it before any exp: a masked inf would turn into NaN through 0 * inf,
    # in the forward sums or in the backward pass.
    def clean(t: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, t.to(dtype), torch.zeros((), dtype=dtype, device=t.device))

    lp = clean(logprobs)
    old = clean(old_logprobs.detach())
    gen = clean(generation_logprobs.detach())
    adv = clean((advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages).detach().expand_as(logprobs))

    pg, clipped, dual = _clipped_surrogate(lp, old, adv, m, config)
    weight, raw_weight, oob_ratio = _importance_weights(old, gen, m, config, n_tok, n_seq)
    truncated_weight = weight
    if not config.use_importance_sampling_correction:
        weight = torch.ones_like(weight)
    k3 = None
    if reference_logprobs is not None and beta != 0:
        k3 = _k3(lp, clean(reference_logprobs.detach()), score_function=config.kl_score_function_gradient)

    # The KL term is not IS-weighted, as in NeMo RL: w corrects the sampling of the policy-gradient term, while the
    # KL is a regulariser on pi_theta itself; weighting it would also let icepop/seq-mask-tis switch the KL off on
    # exactly the tokens where the policies disagree most.
    pg_term = weight * pg
    per_token = pg_term if k3 is None else pg_term + beta * k3

    def reduce(x: torch.Tensor) -> torch.Tensor:
        if config.token_level_loss:
            return (x * m).sum() / n_tok
        return _row_mean(x, m).sum() / n_seq  # a fully padded row adds 0 and is not counted in n_seq

    loss = reduce(per_token)
    with torch.no_grad():
        metrics = {
            "loss": loss.detach(),
            "pg_loss": reduce(pg_term),
            "kl": reduce(k3) if k3 is not None else torch.zeros((), dtype=dtype, device=m.device),
            "clip_fraction": (clipped.to(dtype) * m).sum() / n_tok,
            "dual_clip_fraction": (dual.to(dtype) * m).sum() / n_tok,
            "is_oob_ratio": oob_ratio,
            "token_mult_prob_error": (torch.exp((old - gen).abs()) * m).sum() / n_tok,
            **_is_ratio_stats(raw_weight, truncated_weight, m, n_tok, n_seq, config.sequence_level_importance_ratios),
        }
    return loss, metrics


def _check_inputs(logprobs: torch.Tensor, old_logprobs: torch.Tensor, generation_logprobs: torch.Tensor,
                  advantages: torch.Tensor, mask: torch.Tensor, reference_logprobs: torch.Tensor | None) -> None:
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must have shape [B, T], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    per_token = {"old_logprobs": old_logprobs, "generation_logprobs": generation_logprobs, "mask": mask}
    if reference_logprobs is not None:
        per_token["reference_logprobs"] = reference_logprobs
    for name, tensor in per_token.items():
        if tensor.shape != shape:
            raise ValueError(f"{name} must have the shape of logprobs {tuple(shape)}, got {tuple(tensor.shape)}")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(f"advantages must have shape [B] = {tuple(shape[:1])} or [B, T] = {tuple(shape)}, "
                         f"got {tuple(advantages.shape)}")
    for name, tensor in {"logprobs": logprobs, "advantages": advantages, **per_token}.items():
        if name != "mask" and not tensor.is_floating_point():
            raise ValueError(f"{name} must be a floating-point tensor, got {tensor.dtype}")


def _normaliser(value: float | torch.Tensor, name: str, like: torch.Tensor) -> torch.Tensor:
    count = torch.as_tensor(value, dtype=like.dtype, device=like.device).detach()
    if count.numel() != 1:
        raise ValueError(f"{name} must be a scalar count, got shape {tuple(count.shape)}")
    if isinstance(value, int | float) and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    # A count of 0 means no valid token anywhere, so every numerator is 0 too: give 0, not NaN.
    return count.reshape(()).clamp(min=1)


def _row_mean(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    return (x * m).sum(dim=-1) / m.sum(dim=-1).clamp(min=1)


def _clipped_surrogate(lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, m: torch.Tensor,
                       cfg: LossSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token clipped (and dual-clipped) loss, plus where each clip was the active branch."""
    log_ratio = lp - old
    if cfg.sequence_level_importance_ratios:
        log_ratio = _row_mean(log_ratio, m).unsqueeze(-1).expand_as(lp)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - cfg.ratio_clip_min, 1 + cfg.ratio_clip_max)
    # where() rather than max(): inside the clip range both branches are equal, and the unclipped one carries the
    # gradient; outside it the clipped branch is constant in theta.
    is_clipped = clipped > unclipped
    loss = torch.where(is_clipped, clipped, unclipped)
    is_dual = torch.zeros_like(is_clipped)
    if cfg.ratio_clip_c is not None:
        dual = -adv * cfg.ratio_clip_c
        is_dual = (adv < 0) & (dual < loss)
        loss = torch.where(is_dual, dual, loss)
    return loss, is_clipped, is_dual


@torch.no_grad()
def _importance_weights(old: torch.Tensor, gen: torch.Tensor, m: torch.Tensor, cfg: LossSettings, n_tok: torch.Tensor,
                        n_seq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(truncated weights, raw weights, this piece's share of NeMo's ``is_oob_ratio``); weights are ``[B, T]``.

    ``is_oob_ratio`` is the fraction of tokens whose weight is outside the bounds (``tis``, ``icepop``), or of
    sequences whose geometric-mean weight is (``seq-mask-tis``), over the global valid tokens / sequences."""
    log_w = old - gen  # 0 on padding
    if cfg.sequence_level_importance_ratios:
        raw = torch.exp(log_w.sum(dim=-1, keepdim=True)).expand_as(log_w)
    else:
        raw = torch.exp(log_w)
    raw = torch.nan_to_num(raw, nan=0.0, posinf=0.0, neginf=0.0)
    hi, lo = cfg.truncated_importance_sampling_ratio, cfg.truncated_importance_sampling_ratio_min
    kind = cfg.truncated_importance_sampling_type
    if kind is None or hi is None:
        return raw, raw, m.new_zeros(())
    if kind == "tis":
        # Weights are >= 0, so a lower bound of 0 clamps nothing: the old cap-only tis is this with floor 0.
        floor = (lo or 0.0) if cfg.tis_clamps_below else 0.0
        oob = (raw > hi) | (raw < floor)
        return raw.clamp(min=floor, max=hi), raw, (oob.to(m.dtype) * m).sum() / n_tok
    assert lo is not None  # LossConfig requires a lower bound for icepop / seq-mask-tis
    if kind == "icepop":
        keep = (raw >= lo) & (raw <= hi)
        oob_ratio = ((~keep).to(m.dtype) * m).sum() / n_tok
    else:  # seq-mask-tis: judge the sequence by its geometric-mean weight, keep raw token weights
        geo_mean = torch.exp(_row_mean(log_w, m))
        seq_keep = (geo_mean >= lo) & (geo_mean <= hi)
        oob_ratio = ((~seq_keep) & (m.sum(dim=-1) > 0)).to(m.dtype).sum() / n_seq
        keep = seq_keep.unsqueeze(-1).expand_as(raw)
    return torch.where(keep, raw, torch.zeros_like(raw)), raw, oob_ratio


def _k3(lp: torch.Tensor, ref: torch.Tensor, *, score_function: bool) -> torch.Tensor:
    """Per-token k3 KL, clamped like NeMo RL's ``calculate_kl``.

    With ``score_function`` it is multiplied by ``exp(lp - sg(lp))`` (value 1), as NeMo RL does now: the KL is an
    expectation over tokens sampled from pi_theta, so its gradient gains ``k3 * grad(lp)``; the total per-token
    gradient becomes ``lp - ref``. Where the log-ratio clamp is active the factor is detached, so a clamped token
    has no gradient at all, and the output clamp applies to the product (its value is k3's)."""
    log_r_raw = ref - lp
    log_r = log_r_raw.clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    k3 = torch.exp(log_r) - 1 - log_r
    if score_function:
        factor = torch.nan_to_num(torch.exp(lp - lp.detach()), nan=0.0, posinf=0.0, neginf=0.0)
        k3 = torch.where(log_r_raw == log_r, factor, factor.detach()) * k3
    return k3.clamp(-KL_VALUE_CLAMP, KL_VALUE_CLAMP)


def _is_ratio_stats(raw: torch.Tensor, truncated: torch.Tensor, m: torch.Tensor, n_tok: torch.Tensor,
                    n_seq: torch.Tensor, per_sequence: bool) -> dict[str, torch.Tensor]:
    """IS-weight statistics over valid tokens, or over valid sequences with sequence-level weights: NeMo RL's
    ``sampling_importance_ratio`` (the mean of the weights as used, i.e. after truncation), and the range of the
    untruncated weights (``is_ratio_min`` / ``is_ratio_max``, ours: how far the engines drifted)."""
    if per_sequence:
        # Every token of a row carries the same sequence weight; [:, :1].sum keeps T == 0 well defined.
        values, used, valid, norm = raw[:, :1].sum(dim=-1), truncated[:, :1].sum(dim=-1), m.sum(dim=-1) > 0, n_seq
    else:
        values, used, valid, norm = raw, truncated, m > 0, n_tok
    inf = raw.new_full((), float("inf"))  # a fill kernel: torch.tensor(..., device=cuda) would wait for the device
    return {
        "sampling_importance_ratio": (used * valid.to(raw.dtype)).sum() / norm,
        "is_ratio_min": torch.where(valid, values, inf).amin() if values.numel() else inf,
        "is_ratio_max": torch.where(valid, values, -inf).amax() if values.numel() else -inf,
    }
