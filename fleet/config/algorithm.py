"""`grpo.*` and `loss_fn.*`: the algorithm (seed key names and defaults kept; formulas in trainer/grpo)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fleet.config.base import Section


class AsyncGrpoConfig(Section):
    enabled: bool = False
    """Asynchronous GRPO: rollouts run ahead of training through the replay buffer."""
    max_trajectory_age_steps: int = Field(1, ge=0)
    """A trajectory generated with weight version v may train step s only if s - v <= this bound."""
    in_flight_weight_updates: bool = False
    """Push new weights into the engines while they generate (requests in flight continue with the new weights)."""
    recompute_kv_cache_after_weight_updates: bool = False
    """Invalidate the KV/prefix cache at each weight update, so no token uses keys/values of older weights."""

    @property
    def age_bound(self) -> int:
        """The age bound in force: a trajectory of weight version v may train step s only if s - v <= this. The
        synchronous loop is the asynchronous one with bound 0 (a group trains the step whose weights generated it),
        so `max_trajectory_age_steps` is ignored unless `enabled`."""
        return self.max_trajectory_age_steps if self.enabled else 0


class GrpoConfig(Section):
    num_prompts_per_step: int = Field(16, ge=1)
    """Prompt groups per optimizer step."""
    num_generations_per_prompt: int = Field(8, ge=1)
    """G: answers generated per prompt."""
    max_num_steps: int = Field(1000, ge=1)
    """Optimizer steps of the run."""
    max_train_s: float | None = Field(None, gt=0)
    """Wall-clock budget of the training loop, counted from its first step (None: none). No step starts after it;
    the run then ends as at `max_num_steps`, with a last validation round of the final weights where `val_period`
    is set and they were not validated yet. For a fixed allocation: a job's time limit, a benchmark's window."""
    use_leave_one_out_baseline: bool = True
    """Baseline of sample i is the mean reward of the other G-1 samples of its group."""
    normalize_rewards: bool = True
    """Divide advantages by the group's reward standard deviation."""
    seed: int = 42
    """Seed of data order and sampling."""
    skip_update_without_signal: bool = False
    """Make no optimizer update in a step whose samples all have advantage 0 (no group with reward spread) when
    there is no KL term: its gradient is exactly 0, yet AdamW would still move the weights by its momentum (and
    decay them) with nothing learned from the step's data. The weight version still advances (the same weights);
    `train/skipped_no_signal` logs it. false: update anyway, as NeMo RL does."""
    val_period: int = Field(0, ge=0)
    """Validate every this many steps (0 = never)."""
    val_at_start: bool = False
    """Validate before the first step."""
    max_val_samples: int = Field(32, ge=1)
    """Validation tasks per validation."""
    val_temperature: float = Field(0.0, ge=0)
    """Sampling temperature for validation (0 = greedy)."""
    val_timeout_s: float | None = Field(None, gt=0)
    """Longest a validation round waits for its tasks (None: grpo.sample_timeout_s). A task not back by then (its
    scoring infrastructure kept failing, so the buffer dead-lettered it) counts as an infrastructure error."""
    sample_timeout_s: float = Field(3600.0, gt=0)
    """Longest the trainer waits for one step's groups before failing the run with a starvation report."""
    sample_deadline_s: float = Field(10.0, gt=0)
    """Deadline of one Sample call: the trainer takes whatever whole groups are ready by then (at least one) and
    asks again for the rest, logging the buffer's starvation report each time an answer comes back short."""
    async_grpo: AsyncGrpoConfig = Field(default_factory=AsyncGrpoConfig)
    """Asynchronous GRPO settings."""


TruncationType = Literal["tis", "icepop", "seq-mask-tis"]


class LossConfig(Section):
    """The clipped policy-gradient loss. Every rule the loss relies on is checked here, so `grpo-fleet config check`
    rejects whatever the trainer would (trainer/grpo/loss.py reads this section and checks nothing itself)."""

    reference_policy_kl_penalty: float = Field(0.01, ge=0)
    """beta of the k3 KL to the frozen reference policy (0 = no reference model is kept)."""
    reference_policy_kl_type: Literal["k3"] = "k3"
    """KL estimator (only Schulman's k3 is implemented)."""
    kl_score_function_gradient: bool = True
    """Multiply the k3 KL by exp(logp - sg(logp)), whose value is 1, as NeMo RL does now: the KL's gradient gains
    the score-function term beta*k3*grad(logp) (the KL is an expectation under the policy being trained), detached
    on tokens where the log-ratio clamp (+-20) is active. false: the gradient of beta*k3 alone (NeMo RL before)."""
    ratio_clip_min: float = Field(0.2, ge=0, le=1)
    """epsilon_min: the ratio is clipped below at 1 - ratio_clip_min."""
    ratio_clip_max: float = Field(0.2, ge=0)
    """epsilon_max: the ratio is clipped above at 1 + ratio_clip_max (DAPO's clip-higher when larger than
    ratio_clip_min)."""
    ratio_clip_c: float | None = Field(None, gt=1)
    """Dual clip constant c (> 1, usually 3): for negative advantages the loss is at most -A*c (None = off)."""
    use_importance_sampling_correction: bool = False
    """Weight each token by pi_old / pi_gen (required by async GRPO)."""
    truncated_importance_sampling_type: TruncationType | None = None
    """tis: clamp weights to [truncated_importance_sampling_ratio_min (null = 0), truncated_importance_sampling_ratio];
    icepop: zero tokens whose weight is outside [min, max]; seq-mask-tis: zero sequences whose geometric-mean weight
    is outside it (kept sequences keep their raw token weights). null: untruncated weights."""
    truncated_importance_sampling_ratio: float | None = Field(None, gt=0)
    """Upper bound of the importance weight (needed by every truncation type)."""
    truncated_importance_sampling_ratio_min: float | None = Field(None, ge=0)
    """Lower bound of the importance weight (needed by icepop and seq-mask-tis; optional for tis, where null is 0)."""
    tis_clamps_below: bool = True
    """tis clamps weights below at truncated_importance_sampling_ratio_min, as NeMo RL does now. false: tis only
    caps weights at the upper bound and ignores the lower one (NeMo RL before, and grpo-fleet until 2026-12)."""
    sequence_level_importance_ratios: bool = False
    """Sequence-level ratios (NeMo RL / GSPO): the PPO ratio is the geometric mean of pi/pi_old over the
    sequence's tokens and the importance weight is the product of pi_old/pi_gen over them. Needs
    token_level_loss=false."""
    token_level_loss: bool = True
    """Average over all valid tokens of the global batch (False: per-sequence mean, then over sequences)."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> LossConfig:
        if self.sequence_level_importance_ratios and self.token_level_loss:
            raise ValueError("loss_fn.sequence_level_importance_ratios=true needs loss_fn.token_level_loss=false "
                             "(GSPO weighs whole sequences)")
        kind, hi, lo = (self.truncated_importance_sampling_type, self.truncated_importance_sampling_ratio,
                        self.truncated_importance_sampling_ratio_min)
        if kind is None:
            # NeMo warns and ignores stray bounds; a bound that silently does nothing is worse than an error.
            if hi is not None or lo is not None:
                raise ValueError("loss_fn.truncated_importance_sampling_ratio(_min) is set but "
                                 "loss_fn.truncated_importance_sampling_type is null; set the type or drop the bounds")
            return self
        if not self.use_importance_sampling_correction:
            raise ValueError(f"loss_fn.truncated_importance_sampling_type={kind} needs "
                             "loss_fn.use_importance_sampling_correction=true")
        if hi is None:
            raise ValueError(f"loss_fn.truncated_importance_sampling_ratio (upper bound) must be set when "
                             f"loss_fn.truncated_importance_sampling_type={kind}")
        if lo is None and kind != "tis":
            raise ValueError(f"loss_fn.truncated_importance_sampling_type={kind} needs "
                             "loss_fn.truncated_importance_sampling_ratio_min (the lower bound)")
        if lo is not None and lo > hi:
            raise ValueError(f"loss_fn.truncated_importance_sampling_ratio_min ({lo}) must be <= "
                             f"loss_fn.truncated_importance_sampling_ratio ({hi})")
        if kind == "seq-mask-tis" and self.sequence_level_importance_ratios:
            raise ValueError("loss_fn.truncated_importance_sampling_type=seq-mask-tis keeps token-level weights and "
                             "cannot be combined with loss_fn.sequence_level_importance_ratios=true")
        return self
