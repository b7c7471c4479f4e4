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
  step. Truncation: ``tis`` caps w at the upper bound; ``icepop`` zeroes tokens with w outside [min, max];
  ``seq-mask-tis`` zeroes whole sequences whose geometric-mean w is outside [min, max] and keeps raw token weights.
* k3 KL to the reference policy: ``logr = clamp(logp_ref - logp_theta, +-20)``, ``k3 = e^logr - 1 - logr``
  clamped to +-10, times ``reference_policy_kl_penalty``.

Global normalisation: the token-level loss is ``sum(mask * (w L + beta k3)) / global_valid_tokens``, the
sequence-level loss ``sum_b masked_mean_t(w L + beta k3) / global_valid_seqs``, where the normalisers count the
whole optimizer-step batch across micro-batches and data-parallel ranks (``count_valid`` per piece, then summed /
all-reduced). Each piece's loss is then its exact share of the big-batch loss, so summing gradients over
micro-batches and ranks (no averaging) gives the gradient of one big batch. A local mean would weight a short
micro-batch's tokens more than a long one's. Metrics follow the same rule: the mean-like ones are partial sums that
add up over pieces; ``is_ratio_min``/``is_ratio_max`` are local and reduce by min/max (+-inf when empty).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["LossConfig", "TruncationType", "count_valid", "grpo_loss"]

logger = logging.getLogger(__name__)

TruncationType = Literal["tis", "icepop", "seq-mask-tis"]
_TRUNCATION_TYPES = ("tis", "icepop", "seq-mask-tis")
# NeMo RL's defaults for kl_input_clamp_value / kl_output_clamp_value: exp(20) is finite in float32 and the
# clamped k3 stays bounded for tokens the reference finds impossible.
KL_LOG_RATIO_CLAMP = 20.0
KL_VALUE_CLAMP = 10.0


@dataclass(frozen=True)
class LossConfig:
    """The seed's ``loss_fn.*`` keys; validated on construction with errors that name the key."""

    ratio_clip_min: float = 0.2
    """epsilon below 1: the ratio is clipped at ``1 - ratio_clip_min``."""
    ratio_clip_max: float = 0.2
    """epsilon above 1 (DAPO's clip-higher when larger than ``ratio_clip_min``)."""
    ratio_clip_c: float | None = None
    """Dual-clip constant c (> 1, usually 3): for A < 0 the loss is at most ``-A c``. None disables it."""
    reference_policy_kl_penalty: float = 0.01
    """beta, the weight of the k3 KL to the reference policy; 0 disables the KL (no reference logprobs needed)."""
    reference_policy_kl_type: str = "k3"
    """KL estimator; only Schulman's k3 is implemented."""
    use_importance_sampling_correction: bool = False
    """Multiply the policy-gradient term by ``pi_old / pi_gen`` (needed for async GRPO)."""
    truncated_importance_sampling_type: TruncationType | None = None
    """``tis`` | ``icepop`` | ``seq-mask-tis``; None for untruncated weights."""
    truncated_importance_sampling_ratio: float | None = None
    """Upper bound on the IS weight (all truncation types)."""
    truncated_importance_sampling_ratio_min: float | None = None
    """Lower bound on the IS weight (``icepop`` and ``seq-mask-tis``; NeMo's ``tis`` ignores it, and so do we)."""
    sequence_level_importance_ratios: bool = False
    """GSPO: one ratio and one IS weight per sequence instead of per token; needs ``token_level_loss=false``."""
    token_level_loss: bool = True
    """Average over all valid tokens of the batch (True) or over per-sequence means (False)."""

    def __post_init__(self) -> None:
        _validate_config(self)


def _validate_config(cfg: LossConfig) -> None:
    if cfg.reference_policy_kl_type != "k3":
        raise ValueError(f"loss_fn.reference_policy_kl_type must be 'k3' (the only KL estimator implemented), "
                         f"got {cfg.reference_policy_kl_type!r}")
    if cfg.reference_policy_kl_penalty < 0:
        raise ValueError(f"loss_fn.reference_policy_kl_penalty must be >= 0, got {cfg.reference_policy_kl_penalty}")
    if not 0 <= cfg.ratio_clip_min <= 1:
        raise ValueError(f"loss_fn.ratio_clip_min must be in [0, 1], got {cfg.ratio_clip_min}")
    if cfg.ratio_clip_max < 0:
        raise ValueError(f"loss_fn.ratio_clip_max must be >= 0, got {cfg.ratio_clip_max}")
    if cfg.ratio_clip_c is not None and not cfg.ratio_clip_c > 1:
        raise ValueError(f"loss_fn.ratio_clip_c must be > 1 (usually 3), got {cfg.ratio_clip_c}; "
                         "set it to null to disable dual clipping")
    if cfg.sequence_level_importance_ratios and cfg.token_level_loss:
        raise ValueError("loss_fn.sequence_level_importance_ratios=true needs loss_fn.token_level_loss=false "
                         "(GSPO weighs whole sequences)")
    kind, hi, lo = (cfg.truncated_importance_sampling_type, cfg.truncated_importance_sampling_ratio,
                    cfg.truncated_importance_sampling_ratio_min)
    if kind is None:
        # NeMo warns and ignores stray bounds; a bound that silently does nothing is worse than an error here.
        if hi is not None or lo is not None:
            raise ValueError("loss_fn.truncated_importance_sampling_ratio(_min) is set but "
                             "loss_fn.truncated_importance_sampling_type is null; set the type or drop the bounds")
        return
    if kind not in _TRUNCATION_TYPES:
        raise ValueError(f"loss_fn.truncated_importance_sampling_type must be one of {_TRUNCATION_TYPES} or null, "
                         f"got {kind!r}")
    if not cfg.use_importance_sampling_correction:
        raise ValueError("loss_fn.truncated_importance_sampling_type needs "
                         "loss_fn.use_importance_sampling_correction=true")
    if hi is None or not hi > 0:
        raise ValueError(f"loss_fn.truncated_importance_sampling_ratio must be > 0 when "
                         f"loss_fn.truncated_importance_sampling_type={kind!r}, got {hi}")
    if kind == "tis":
        if lo is not None:
            logger.warning("loss_fn.truncated_importance_sampling_ratio_min=%s is ignored by 'tis', which only "
                           "caps weights at loss_fn.truncated_importance_sampling_ratio (as NeMo RL does)", lo)
        return
    if lo is None or not 0 <= lo <= hi:
        raise ValueError(f"loss_fn.truncated_importance_sampling_ratio_min must be in "
                         f"[0, loss_fn.truncated_importance_sampling_ratio={hi}] for {kind!r}, got {lo}")
    if kind == "seq-mask-tis" and cfg.sequence_level_importance_ratios:
        raise ValueError("loss_fn.truncated_importance_sampling_type='seq-mask-tis' keeps token-level weights and "
                         "cannot be combined with loss_fn.sequence_level_importance_ratios=true")


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
    config: LossConfig,
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
    weight, raw_weight, truncated = _importance_weights(old, gen, m, config)
    if not config.use_importance_sampling_correction:
        weight = torch.ones_like(weight)
    k3 = _k3(lp, clean(reference_logprobs.detach())) if reference_logprobs is not None and beta != 0 else None

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
            "is_truncated_fraction": (truncated.to(dtype) * m).sum() / n_tok,
            "token_mult_prob_error": (torch.exp((old - gen).abs()) * m).sum() / n_tok,
            **_is_ratio_stats(raw_weight, m, n_tok, n_seq, config.sequence_level_importance_ratios),
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
                       cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
def _importance_weights(old: torch.Tensor, gen: torch.Tensor, m: torch.Tensor,
                        cfg: LossConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weights used, raw weights before truncation, where truncation changed a weight), all ``[B, T]``."""
    log_w = old - gen  # 0 on padding
    if cfg.sequence_level_importance_ratios:
        raw = torch.exp(log_w.sum(dim=-1, keepdim=True)).expand_as(log_w)
    else:
        raw = torch.exp(log_w)
    raw = torch.nan_to_num(raw, nan=0.0, posinf=0.0, neginf=0.0)
    hi, lo = cfg.truncated_importance_sampling_ratio, cfg.truncated_importance_sampling_ratio_min
    kind = cfg.truncated_importance_sampling_type
    if kind is None or hi is None:
        return raw, raw, torch.zeros_like(raw, dtype=torch.bool)
    if kind == "tis":
        return raw.clamp(max=hi), raw, raw > hi
    assert lo is not None  # LossConfig guarantees a lower bound for icepop / seq-mask-tis
    if kind == "icepop":
        keep = (raw >= lo) & (raw <= hi)
    else:  # seq-mask-tis: judge the sequence by its geometric-mean weight, keep raw token weights
        geo_mean = torch.exp(_row_mean(log_w, m)).unsqueeze(-1)
        keep = ((geo_mean >= lo) & (geo_mean <= hi)).expand_as(raw)
    return torch.where(keep, raw, torch.zeros_like(raw)), raw, ~keep


def _k3(lp: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    log_r = (ref - lp).clamp(-KL_LOG_RATIO_CLAMP, KL_LOG_RATIO_CLAMP)
    return (torch.exp(log_r) - 1 - log_r).clamp(-KL_VALUE_CLAMP, KL_VALUE_CLAMP)


def _is_ratio_stats(raw: torch.Tensor, m: torch.Tensor, n_tok: torch.Tensor, n_seq: torch.Tensor,
                    per_sequence: bool) -> dict[str, torch.Tensor]:
    """Untruncated IS-ratio statistics: over valid tokens, or over valid sequences with sequence-level weights."""
    if per_sequence:
        # Every token of a row carries the same sequence weight; [:, :1].sum keeps T == 0 well defined.
        values, valid, norm = raw[:, :1].sum(dim=-1), m.sum(dim=-1) > 0, n_seq
    else:
        values, valid, norm = raw, m > 0, n_tok
    inf = raw.new_full((), float("inf"))  # a fill kernel: torch.tensor(..., device=cuda) would wait for the device
    return {
        "is_ratio_mean": (values * valid.to(raw.dtype)).sum() / norm,
        "is_ratio_min": torch.where(valid, values, inf).amin() if values.numel() else inf,
        "is_ratio_max": torch.where(valid, values, -inf).amax() if values.numel() else -inf,
    }
