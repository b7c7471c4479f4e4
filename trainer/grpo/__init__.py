"""GRPO's pure math: group-relative advantages and the clipped, importance-corrected policy loss.

Nothing here touches models, devices or processes: tensors in, tensors out, so the definitions can be tested
against an independent reference and reused by any trainer loop.
"""

from trainer.grpo.advantages import compute_advantages
from trainer.grpo.loss import LossSettings, count_valid, grpo_loss

__all__ = ["LossSettings", "compute_advantages", "count_valid", "grpo_loss"]
