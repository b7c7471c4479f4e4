"""Group-relative advantages for GRPO, with NeMo RL's definitions.

Each prompt is sampled G times; its G rewards form one row of ``rewards`` ``[num_groups, G]``. The advantage of
response i is its reward minus a baseline built from its own group:

* leave-one-out (RLOO, https://arxiv.org/abs/2402.14740): ``b_i = mean_{j != i} r_j``, and ``s_i`` is the Bessel
  (unbiased) standard deviation of those G-1 other rewards;
* otherwise: ``b_i`` is the group mean and ``s_i`` the Bessel standard deviation of the whole group.

With ``normalize`` the advantage is ``(r_i - b_i) / (s_i + 1e-6)`` where ``s_i > 0`` and ``r_i - b_i`` where
``s_i == 0`` (NeMo RL does not sharpen groups without variation); without it, ``r_i - b_i``.

Edge cases, chosen to match NeMo RL's ``calculate_baseline_and_std_per_prompt``:

* G == 1: the advantage is 0 (NeMo sets the baseline to the reward when a group has at most one valid sample, so
  a lone response teaches nothing instead of dividing by zero).
* G == 2 with leave-one-out: the "others" are a single reward, whose Bessel std is undefined; it is taken as 0, so
  the advantage is the plain difference ``r_i - r_j`` even with ``normalize`` (NeMo gets 0 from ``nan_to_num``).
* A group whose rewards are all equal gets exactly 0 (not 1e-17): rewards are centred on the group's first
  reward before any mean is taken, so every difference is an exact zero.

The caller copies the per-response advantage onto every response token; the loss accepts ``[B]`` advantages and
does that broadcast itself.
"""

from __future__ import annotations

import torch

__all__ = ["ADVANTAGE_STD_EPSILON", "compute_advantages"]

# NeMo RL's epsilon: added to the std (not the variance), and only where the std is positive.
ADVANTAGE_STD_EPSILON = 1e-6


def compute_advantages(rewards: torch.Tensor, *, leave_one_out: bool, normalize: bool) -> torch.Tensor:
    """Return the GRPO advantage of every response, shape ``[num_groups, G]`` like ``rewards``.

    The result has the dtype of ``rewards`` when it is floating point (float32 otherwise, e.g. for integer 0/1
    rewards); the arithmetic is done in float64 so float32 rewards lose nothing to cancellation.
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must have shape [num_groups, G], got shape {tuple(rewards.shape)}")
    group_size = rewards.shape[1]
    if group_size < 1:
        raise ValueError("rewards must have at least one response per group (G >= 1), got G = 0")
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    x = rewards.detach().to(torch.float64)
    if not bool(torch.isfinite(x).all()):
        raise ValueError("rewards must be finite (got NaN or inf)")
    if group_size == 1:
        return torch.zeros_like(x, dtype=out_dtype)

    # "std > 0" is decided exactly, from the raw rewards, not from a rounded std: when a pool is all equal its
    # float mean can be off by an ulp, and a 1e-17 std would scale A by 1e6; a real but tiny spread must not
    # round away into "no spread" either.
    varies = _pool_varies(x, leave_one_out)
    # Shifting a group by a constant changes no difference, mean-difference or std, but makes every difference
    # inside an all-equal group an exact 0 (sums of equal floats, divided back, need not round-trip exactly).
    x = x - x[:, :1]
    baseline, std = _leave_one_out_stats(x) if leave_one_out else _group_stats(x)
    advantages = x - baseline
    if normalize:
        advantages = torch.where(varies, advantages / (std + ADVANTAGE_STD_EPSILON), advantages)
    return advantages.to(out_dtype)


def _pool_varies(x: torch.Tensor, leave_one_out: bool) -> torch.Tensor:
    """Whether the rewards a response is normalised against (its others, or its whole group) are not all equal."""
    if not leave_one_out:
        return (x.amax(dim=1, keepdim=True) > x.amin(dim=1, keepdim=True)).expand_as(x)
    group_size = x.shape[1]
    if group_size == 2:
        # One "other" reward: Bessel's std is undefined; NeMo's nan_to_num makes it 0, and so do we.
        return torch.zeros_like(x, dtype=torch.bool)
    others = ~torch.eye(group_size, dtype=torch.bool, device=x.device)
    table = x.unsqueeze(1).expand(-1, group_size, group_size)  # table[g, i, j] = x[g, j]
    inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
    return torch.where(others, table, -inf).amax(dim=-1) > torch.where(others, table, inf).amin(dim=-1)


def _group_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Group mean and Bessel std, each broadcast to ``x``'s shape."""
    group_size = x.shape[1]
    mean = x.mean(dim=1, keepdim=True)
    std = ((x - mean).square().sum(dim=1, keepdim=True) / (group_size - 1)).sqrt()
    return mean.expand_as(x), std.expand_as(x)


def _leave_one_out_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and Bessel std of the other G-1 rewards of each response (std 0 when there is one other).

    Built as a ``[num_groups, G, G]`` table (row i holds the group with column i masked out): G is a handful of
    samples per prompt, so the table is tiny, and it keeps the two-pass variance instead of ``E[r^2] - E[r]^2``,
    which cancels badly.
    """
    num_groups, group_size = x.shape
    others = ~torch.eye(group_size, dtype=torch.bool, device=x.device)  # others[i, j]: j is one of i's others
    table = x.unsqueeze(1).expand(num_groups, group_size, group_size)  # table[g, i, j] = x[g, j]
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    baseline = torch.where(others, table, zero).sum(dim=-1) / (group_size - 1)
    if group_size == 2:
        return baseline, torch.zeros_like(baseline)
    deviations = torch.where(others, table - baseline.unsqueeze(-1), zero)
    return baseline, (deviations.square().sum(dim=-1) / (group_size - 2)).sqrt()
