"""Advantages: pure tensor functions of rewards.

Layout convention: `rewards` is shape (B,) with B = P·G, the G completions of each prompt contiguous
(rows [g·G, (g+1)·G) belong to prompt g). No I/O, no device code, no config objects.
"""

from __future__ import annotations

import torch

from ..options import check_choice

EPS = 1e-4
"""Added to scale estimates; with rewards in [0, 1] this caps |A| near 3 for a single success in 8."""


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D (B,), got shape {tuple(rewards.shape)}")
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"group_size={group_size} must be ≥ 2 and divide the batch of {rewards.numel()} rewards")
    return rewards.view(-1, group_size)


def zero_std_mask(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) bool: True where the completion's group has identical rewards (no learning signal)."""
    g = _groups(rewards, group_size)
    same = (g.max(dim=1).values - g.min(dim=1).values) == 0
    return same.repeat_interleave(group_size)


def zero_std_fraction(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Fraction of groups whose G rewards are all equal: A = 0 for every completion there, so those
    prompts teach nothing this step. High values mean the task is too easy or too hard right now."""
    g = _groups(rewards, group_size)
    return ((g.max(dim=1).values - g.min(dim=1).values) == 0).float().mean()


def group_zscore(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:
    """GRPO's advantage: A_i = (r_i − mean_g(r)) / (std_g(r) + eps), std with Bessel's correction (ddof 1).

    Groups with zero variance get A = 0 exactly (never NaN, never rounding noise).
    """
    g = _groups(rewards, group_size).float()
    adv = (g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + eps)
    return torch.where(zero_std_mask(rewards, group_size).view_as(g), torch.zeros_like(adv), adv).flatten()


def group_centered(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Dr GRPO's advantage: A_i = r_i − mean_g(r). No std division, so easy or hard prompts are not
    up-weighted."""
    g = _groups(rewards, group_size).float()
    adv = g - g.mean(dim=1, keepdim=True)
    return torch.where(zero_std_mask(rewards, group_size).view_as(g), torch.zeros_like(adv), adv).flatten()


def group_mad(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:
    """Robust advantage: A_i = (r_i − median_g(r)) / (1.4826 · MAD_g + eps), MAD = median |r − median|.

    1.4826 makes MAD estimate the std for normal data. When MAD is 0 but the group is not constant (one
    outlier), the scale falls back to the group std, so the outlier still gets a finite signal.
    """
    g = _groups(rewards, group_size).float()
    # quantile(0.5) averages the two middle values for even G (torch.median would take the lower one)
    med = torch.quantile(g, 0.5, dim=1, keepdim=True)
    mad = 1.4826 * torch.quantile((g - med).abs(), 0.5, dim=1, keepdim=True)
    scale = torch.where(mad > 0, mad, g.std(dim=1, keepdim=True))
    adv = (g - med) / (scale + eps)
    return torch.where(zero_std_mask(rewards, group_size).view_as(g), torch.zeros_like(adv), adv).flatten()


def batch_normalized(rewards: torch.Tensor, group_size: int, eps: float = EPS) -> torch.Tensor:
    """Group baseline, batch scale: A_i = (r_i − mean_g(r)) / (std_batch(r − mean_g(r)) + eps).

    TRL's `scale_rewards="batch"`: one scale for the whole batch, so prompt difficulty does not re-weight.
    """
    centered = group_centered(rewards, group_size)
    return centered / (centered.std() + eps)


def winsorize(rewards: torch.Tensor, quantile: float) -> torch.Tensor:
    """Clamp rewards to the batch's [q, 1 − q] quantiles (q = 0 returns them unchanged)."""
    if not 0.0 <= quantile < 0.5:
        raise ValueError(f"winsorize quantile must be in [0, 0.5), got {quantile}")
    if quantile == 0:
        return rewards
    r = rewards.float()
    lo, hi = torch.quantile(r, quantile), torch.quantile(r, 1 - quantile)
    return r.clamp(lo, hi)


CLIP_MODES = ("none", "symmetric", "asymmetric", "tanh")
"""How advantages are bounded (`clip_advantages` gives each one's formula)."""


def clip_advantages(adv: torch.Tensor, mode: str, high: float = 5.0, low: float = 5.0) -> torch.Tensor:
    """Bound advantages:
        none       A
        symmetric  clamp(A, −high, high)
        asymmetric clamp(A, −low, high)      (e.g. punish failures less than rewarding successes)
        tanh       high · tanh(A / high)     (smooth, keeps order)
    """
    check_choice("advantage clip mode", mode, CLIP_MODES)
    if mode == "symmetric":
        return adv.clamp(-high, high)
    if mode == "asymmetric":
        return adv.clamp(-low, high)
    if mode == "tanh":
        return high * torch.tanh(adv / high)
    return adv


def outcome_gated_rewards(
    per_function: torch.Tensor, weights: torch.Tensor, outcome: int, group_size: int
) -> torch.Tensor:
    """Total rewards (B,) with the shaped terms counted only in groups whose outcome varies:

        total_i = w_o · r_o(i) + Σ_{k ≠ o} w_k · s_k(i),   s_k(i) = r_k(i) if r_o differs within i's group,
                                                                   mean_g(r_k) otherwise

    `per_function` (K, B) holds each reward function's scores (NaN where a function does not apply: counted as 0, as
    in `rewards.compute_rewards`), `weights` (K,) their weights, row `outcome` the outcome (is the answer right).
    A group whose completions are all wrong (or all right) then has equal totals, so no advantage: the shaped
    terms' noise there would otherwise be z-scored into full-size advantages (verl-recipe PR #125). Elsewhere the
    total is the plain weighted sum, and every group keeps its mean reward."""
    scores = torch.nan_to_num(per_function.float(), nan=0.0) * weights.float().unsqueeze(1)  # (K, B)
    groups = scores.view(scores.shape[0], -1, group_size)  # (K, P, G)
    outcome_rows = _groups(per_function[outcome].nan_to_num(0.0), group_size)
    varies = (outcome_rows.max(dim=1).values != outcome_rows.min(dim=1).values).view(1, -1, 1)  # (1, P, 1)
    shaped = torch.ones(scores.shape[0], 1, 1, dtype=torch.bool)
    shaped[outcome] = False
    gated = torch.where(shaped & ~varies, groups.mean(dim=2, keepdim=True).expand_as(groups), groups)
    return gated.sum(0).flatten()


ESTIMATORS = {"zscore": group_zscore, "centered": group_centered, "mad": group_mad, "batch": batch_normalized}
"""The advantage estimators by name, each `(rewards, group_size) -> advantages` (their docstrings give the
formulas): the one list of names `GRPOConfig.advantage` is checked against."""


def compute_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    estimator: str = "zscore",
    tau: float = 1.0,
    clip: str = "none",
    clip_high: float = 5.0,
    clip_low: float = 5.0,
    winsorize_quantile: float = 0.0,
) -> torch.Tensor:
    """The full recipe: A = clip(estimator(winsorize(r)) / τ)."""
    check_choice("advantage estimator", estimator, ESTIMATORS)
    if tau <= 0:
        raise ValueError(f"advantage tau must be > 0, got {tau}")
    adv = ESTIMATORS[estimator](winsorize(rewards, winsorize_quantile), group_size) / tau
    return clip_advantages(adv, clip, clip_high, clip_low)
