"""One GRPO step on every rank: old log-prob recomputation, then micro-batched forward/backward per minibatch,
gradient clipping, optimizer and scheduler step.

`trainer.grpo.grpo_loss` returns each micro-batch's exact share of the minibatch loss (normalised by the global
valid-token count), so the gradient of one big batch is the SUM of the pieces' gradients over micro-batches and
ranks. FSDP2 averages gradients over ranks, hence the loss is scaled by the world size before backward.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trainer.batch import MicroBatch, StepBatch, plan_rank
from trainer.dist import Dist
from trainer.grpo import count_valid, grpo_loss
from trainer.grpo.diagnostics import WORST_TOKEN_KEYS, merge_worst, worst_token
from trainer.logprobs import PackedInputs, trained_only
from trainer.model import PolicyModule, autocast, forward_logprobs, packing_supported

if TYPE_CHECKING:  # the config is only read here: the GPU benchmark runs without pydantic if it must
    from fleet.config.algorithm import GrpoConfig, LossConfig
    from fleet.config.policy import OptimizerConfig, PolicyConfig

log = logging.getLogger(__name__)

_LossInputs = tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor]

# grpo_loss metrics that are additive shares of the minibatch value; the rest reduce by min / max.
_SUM_METRICS = ("loss", "pg_loss", "kl", "clip_fraction", "dual_clip_fraction", "is_oob_ratio",
                "token_mult_prob_error", "sampling_importance_ratio")


def make_optimizer(module: torch.nn.Module, o: OptimizerConfig) -> tuple[torch.optim.Optimizer,
                                                                          torch.optim.lr_scheduler.LambdaLR]:
    params = [p for p in module.parameters() if p.requires_grad]
    on_cuda = bool(params) and params[0].device.type == "cuda"
    opt = torch.optim.AdamW(params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                            fused=True if on_cuda else None)
    warmup = o.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda u: min(1.0, (u + 1) / warmup) if warmup else 1.0)
    return opt, sched


@dataclass
class StepRunner:
    policy_cfg: PolicyConfig
    grpo: GrpoConfig
    loss_cfg: LossConfig
    """Validated where it lives (fleet/config/algorithm.py)."""
    dist: Dist
    policy: PolicyModule
    reference: PolicyModule | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    pad_multiple: int = 1

    def __post_init__(self) -> None:
        self.packing_ok = packing_supported()
        if self.policy_cfg.sequence_packing and not self.packing_ok:
            log.warning("policy.sequence_packing=true but this transformers cannot mask packed samples apart "
                        "(needs >= 4.54): one sample per row instead")

    def plan(self, batch: StepBatch) -> list[list[MicroBatch]]:
        p = self.policy_cfg
        return plan_rank(batch, global_batch=p.train_global_batch_size, micro_batch=p.train_micro_batch_size,
                         rank=self.dist.rank, world=self.dist.world_size, row_tokens=p.max_total_sequence_length,
                         packing=p.sequence_packing and self.packing_ok, pad_multiple=self.pad_multiple,
                         share_prefixes=p.prefix_sharing)

    @torch.no_grad()
    def recompute(self, plan: list[list[MicroBatch]], *, policy: bool = True) -> None:
        """pi_old (unless `policy` is false) and pi_ref of every sample, with the weights before this step's first
        update."""
        if not policy and self.reference is None:
            return
        for minibatch in plan:
            for mb in minibatch:
                packed = trained_only(mb.packed, mb.mask)  # masked-out tokens skip the lm_head
                with autocast(self.policy_cfg, self.dist):
                    if policy:
                        mb.old_logprobs = forward_logprobs(self.policy, packed, self.dist.device).float()
                    if self.reference is not None:
                        mb.reference_logprobs = forward_logprobs(self.reference, packed, self.dist.device).float()

    def run(self, batch: StepBatch) -> dict[str, float]:
        if self._no_signal(batch):
            # Every rank sees the same broadcast batch, so all take this branch together (no collective skipped
            # on one rank only).
            log.info("step %d: no sample has a nonzero advantage and there is no KL term: no update "
                     "(grpo.skip_update_without_signal)", batch.step)
            return {"train/skipped_no_signal": 1.0, "train/optimizer_updates": 0.0, "perf/train_tokens": 0.0,
                    "perf/train_tokens_per_s": 0.0, "timing/logprob_recompute_s": 0.0, "timing/train_s": 0.0,
                    "train/lr": float(self.scheduler.get_last_lr()[0])}
        t0 = time.perf_counter()
        plan = self.plan(batch)
        # One optimizer update per step: every micro-batch's training forward runs on the pre-update weights, so it
        # computes pi_old itself (its detached log-probs) and a separate no-grad pass would only repeat it.
        reuse = len(plan) == 1
        self.recompute(plan, policy=not reuse)
        t1 = time.perf_counter()
        per_update = [self._update(minibatch) for minibatch in plan]
        t2 = time.perf_counter()
        metrics = {k: sum(m[k] for m in per_update) / len(per_update) for k in per_update[0]}
        for k in ("loss/is_ratio_min", "loss/is_ratio_max"):
            metrics[k] = (min if k.endswith("min") else max)(m[k] for m in per_update)
        worst = max(per_update, key=lambda m: m["loss/max_abs_logprob_diff"])  # one token's facts: not averaged
        metrics.update({f"loss/{k}": worst[f"loss/{k}"] for k in WORST_TOKEN_KEYS})
        tokens = torch.tensor([float(sum(mb.tokens for mini in plan for mb in mini))], device=self.dist.device)
        self.dist.all_reduce(tokens)
        metrics.update({
            "timing/logprob_recompute_s": t1 - t0, "timing/train_s": t2 - t1,
            "perf/train_tokens": tokens.item(), "perf/train_tokens_per_s": tokens.item() / max(t2 - t0, 1e-9),
            "train/optimizer_updates": float(len(plan)), "train/lr": float(self.scheduler.get_last_lr()[0]),
            "train/old_logprobs_from_forward": float(reuse), "train/skipped_no_signal": 0.0,
        })
        return metrics

    def _no_signal(self, batch: StepBatch) -> bool:
        return (self.grpo.skip_update_without_signal and self.reference is None
                and not any(s.advantage != 0.0 for s in batch.samples))

    def _global_counts(self, minibatch: list[MicroBatch]) -> tuple[torch.Tensor, torch.Tensor]:
        local = torch.zeros(2, dtype=torch.float64)
        for mb in minibatch:
            tok, seq = count_valid(mb.mask)
            local += torch.stack([tok, seq]).double()
        counts = self.dist.all_reduce(local.to(self.dist.device))
        return counts[0], counts[1]

    def _update(self, minibatch: list[MicroBatch]) -> dict[str, float]:
        n_tok, n_seq = self._global_counts(minibatch)
        scale = float(self.dist.world_size) if self.dist.distributed else 1.0
        sums = torch.zeros(len(_SUM_METRICS), dtype=torch.float64, device=self.dist.device)
        lo = torch.full((1,), float("inf"), dtype=torch.float64, device=self.dist.device)
        hi = torch.full((1,), float("-inf"), dtype=torch.float64, device=self.dist.device)
        self.optimizer.zero_grad(set_to_none=True)
        dev = self.dist.device
        # Every host-to-device copy first, while nothing is queued: a copy from pageable memory waits for the
        # kernels queued before it, so one made between micro-batches would idle the GPU while the host launches.
        staged = [self._stage(mb) for mb in minibatch]
        compared: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # for the worst-token diagnostics
        for mb, (packed, inputs, ref_lp) in zip(minibatch, staged, strict=True):
            with autocast(self.policy_cfg, self.dist):
                lp = forward_logprobs(self.policy, packed, dev)
            old, gen_lp, adv, mask = inputs
            old = lp.detach().float() if old is None else old
            loss, m = grpo_loss(lp, old, gen_lp, adv, mask, self.loss_cfg, global_valid_tokens=n_tok,
                                global_valid_seqs=n_seq, reference_logprobs=ref_lp)
            # A dummy micro-batch contributes nothing but still runs backward, so every rank's FSDP2
            # reduce-scatters pair up.
            (loss * (0.0 if mb.dummy else scale)).backward()
            sums += torch.stack([m[k].double() for k in _SUM_METRICS])
            if not mb.dummy:
                lo = torch.minimum(lo, m["is_ratio_min"].double().reshape(1))
                hi = torch.maximum(hi, m["is_ratio_max"].double().reshape(1))
                compared.append((old.detach(), gen_lp, mask))
        grad_norm = self._clip_and_step()
        worst = None  # after the step: reading the argmax waits for the device (this rank's share only)
        for old_lp, gen_lp, mask in compared:
            worst = merge_worst(worst, worst_token(old_lp, gen_lp, mask))
        self.dist.all_reduce(sums)
        self.dist.all_reduce(lo, "min")
        self.dist.all_reduce(hi, "max")
        out = {f"loss/{k}": v for k, v in zip(_SUM_METRICS, sums.tolist(), strict=True)}
        out.update({"loss/is_ratio_min": lo.item(), "loss/is_ratio_max": hi.item(),
                    "train/grad_norm": float(grad_norm), "loss/valid_tokens": n_tok.item()})
        out.update({f"loss/{k}": v for k, v in (worst or dict.fromkeys(WORST_TOKEN_KEYS, -1.0)).items()})
        if isinstance(grad_norm, torch.Tensor):  # the device-side path: the skip decision is known only now
            self._after_step(out["train/grad_norm"])
        return out

    def _stage(self, mb: MicroBatch) -> tuple[PackedInputs, _LossInputs, torch.Tensor | None]:
        """A micro-batch's inputs on the device: packed tokens, (old, generation log-probs, advantages, mask), ref.
        Old log-probs are None when the training forward provides them (one update per step)."""
        dev = self.dist.device
        old = None if mb.old_logprobs is None else mb.old_logprobs.to(dev)
        inputs = (old, mb.generation_logprobs.to(dev), mb.advantages.to(dev), mb.mask.to(dev))
        ref = None if mb.reference_logprobs is None else mb.reference_logprobs.to(dev)
        return trained_only(mb.packed, mb.mask).to(dev), inputs, ref  # masked-out tokens skip the lm_head

    def _clip_and_step(self) -> float | torch.Tensor:
        """Clip by global norm and step; a non-finite norm skips the update on every rank (the norm is all-reduced).

        A single process with a fused optimizer never waits for the device here: the clip factor goes to the fused
        AdamW kernel as its gradient divisor and the non-finite check as its skip flag (the mechanism GradScaler
        uses), so the next step's kernels queue behind this one. The norm is returned as a tensor; the scheduler
        steps once the caller has read it (`_after_step`)."""
        params = [p for p in self.policy.parameters() if p.grad is not None]
        max_norm = self.policy_cfg.max_grad_norm
        if not self.dist.distributed and self.optimizer.defaults.get("fused") and params:
            return fused_clip_step(self.optimizer, params, max_norm)
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm is not None else float("inf"))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        value = float(norm)
        if math.isfinite(value):
            self.optimizer.step()
        self._after_step(value)
        return value

    def _after_step(self, grad_norm: float) -> None:
        if not math.isfinite(grad_norm):
            log.error("non-finite gradient norm (%s): update skipped", grad_norm)
            self.optimizer.zero_grad(set_to_none=True)
            return
        self.scheduler.step()


def fused_clip_step(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                    max_norm: float | None) -> torch.Tensor:
    """`clip_grad_norm_(params, max_norm)` + `optimizer.step()` (skipped when the norm is not finite) for a fused
    Adam/AdamW, with no host synchronisation: the fused kernel divides the gradients by `grad_scale` (1 / the clip
    coefficient) and does nothing, step count included, where `found_inf` is 1. Returns the norm (a device tensor)."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if max_norm is None:
        scale = torch.ones((), dtype=torch.float32, device=norm.device)
    else:  # clip_grad_norm_'s coefficient, clamped to 1
        scale = torch.clamp((norm.float() + 1e-6) / max_norm, min=1.0)
    found_inf = (~torch.isfinite(norm)).float()
    optimizer.grad_scale, optimizer.found_inf = scale, found_inf  # type: ignore[attr-defined]
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf  # type: ignore[attr-defined]
    return norm
