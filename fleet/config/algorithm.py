"""`grpo.*` and `loss_fn.*`: the algorithm (seed key names and defaults kept; formulas in trainer/grpo)."""

from typing import Literal

from pydantic import Field

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


class GrpoConfig(Section):
    num_prompts_per_step: int = Field(16, ge=1)
    """Prompt groups per optimizer step."""
    num_generations_per_prompt: int = Field(8, ge=1)
    """G: answers generated per prompt."""
    max_num_steps: int = Field(1000, ge=1)
    """Optimizer steps of the run."""
    use_leave_one_out_baseline: bool = True
    """Baseline of sample i is the mean reward of the other G-1 samples of its group."""
    normalize_rewards: bool = True
    """Divide advantages by the group's reward standard deviation."""
    seed: int = 42
    """Seed of data order and sampling."""
    val_period: int = Field(0, ge=0)
    """Validate every this many steps (0 = never)."""
    val_at_start: bool = False
    """Validate before the first step."""
    max_val_samples: int = Field(32, ge=1)
    """Validation tasks per validation."""
    val_temperature: float = Field(0.0, ge=0)
    """Sampling temperature for validation (0 = greedy)."""
    sample_timeout_s: float = Field(3600.0, gt=0)
    """Longest the trainer waits for one step's groups before failing the run with a starvation report."""
    sample_deadline_s: float = Field(10.0, gt=0)
    """Deadline of one Sample call: the trainer takes whatever whole groups are ready by then (at least one) and
    asks again for the rest, logging the buffer's starvation report each time an answer comes back short."""
    async_grpo: AsyncGrpoConfig = Field(default_factory=AsyncGrpoConfig)
    """Asynchronous GRPO settings."""


class LossConfig(Section):
    reference_policy_kl_penalty: float = Field(0.01, ge=0)
    """beta of the k3 KL to the frozen reference policy (0 = no reference model is kept)."""
    reference_policy_kl_type: Literal["k3"] = "k3"
    """KL estimator."""
    ratio_clip_min: float = Field(0.2, ge=0)
    """epsilon_min: the ratio is clipped below at 1 - ratio_clip_min."""
    ratio_clip_max: float = Field(0.2, ge=0)
    """epsilon_max: the ratio is clipped above at 1 + ratio_clip_max."""
    ratio_clip_c: float | None = Field(None, gt=1)
    """Dual clip constant c (> 1) for negative advantages (None = off)."""
    use_importance_sampling_correction: bool = False
    """Weight each token by pi_old / pi_gen (required by async GRPO)."""
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = None
    """tis: cap weights at the upper bound (NeMo RL semantics: the lower bound is not applied); icepop: zero tokens
    whose weight is outside [min, max]; seq-mask-tis: zero sequences whose geometric-mean weight is outside it."""
    truncated_importance_sampling_ratio: float | None = Field(None, gt=0)
    """Upper bound of the importance weight."""
    truncated_importance_sampling_ratio_min: float | None = Field(None, ge=0)
    """Lower bound of the importance weight."""
    sequence_level_importance_ratios: bool = False
    """Sequence-level ratios (NeMo RL / GSPO): the PPO ratio is the geometric mean of pi/pi_old over the
    sequence's tokens and the importance weight is the product of pi_old/pi_gen over them. Needs
    token_level_loss=false."""
    token_level_loss: bool = True
    """Average over all valid tokens of the global batch (False: per-sequence mean, then over sequences)."""
