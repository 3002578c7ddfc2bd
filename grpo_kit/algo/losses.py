"""KL estimators and the GRPO-family policy losses: pure tensor functions of log-probabilities (which
`logprobs.py` computes), each docstring giving its formula. Imports nothing of the kit but `options`.

Shapes: B sequences × T completion tokens. `mask` (B, T) is 1 on real completion tokens (up to and
including the stop token) and 0 after it.
"""

from __future__ import annotations

import torch

from ..options import IMPORTANCE_SAMPLING_LEVELS, KL_ESTIMATORS, LOSS_TYPES, check_choice


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ m·x / max(Σ m, 1)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π (Schulman, "Approximating KL divergence"):

        k1 = log π − log π_ref                      (unbiased, high variance, can be negative)
        k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1   (unbiased, ≥ 0, low variance)

    The log-ratio is clamped to ±20 before exp so a single wild token cannot overflow (bf16 especially).
    """
    diff = (ref_logp - logp).clamp(-20.0, 20.0)
    check_choice("KL estimator", estimator, KL_ESTIMATORS)
    return -diff if estimator == "k1" else torch.exp(diff) - diff - 1.0


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    ref_logp: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_estimator: str = "k3",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    loss_type: str = "grpo",
    importance_sampling_level: str = "token",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    max_completion_length: int | None = None,
    total_sequences: int | None = None,
    total_tokens: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO-family loss for one (micro-)batch; returns (loss, stats), all on the input device.

    Importance ratio, per token (`token`) or per sequence (`sequence`, GSPO):
        ρ_t = exp(log π_t − log π_old,t)          or  ρ_i = exp(Σ_t m_t (log π_t − log π_old,t) / Σ_t m_t)
    Per-token objective with ε_l = epsilon, ε_h = epsilon_high (or epsilon):
        PPO-clip (grpo, bnpo, dapo, dr_grpo):  ℓ_t = −min(ρ_t A_i, clip(ρ_t, 1 − ε_l, 1 + ε_h) A_i)
        CISPO:                                 ℓ_t = −sg[min(ρ_t, 1 + ε_h)] · A_i · log π_t
    plus β·KL_t (k1 or k3 against π_ref) and − entropy_coef·H_t.
    Aggregation over the whole step's batch (so micro-batch losses add up to the full-batch loss):
        grpo:     (1/N) Σ_i (Σ_t m ℓ / Σ_t m)           N = total_sequences
        bnpo:     Σ m ℓ / Σ m  of this micro-batch, × (B / N)   (local token mean, averaged)
        dapo, cispo: Σ m ℓ / total_tokens                 (global token mean)
        dr_grpo:  Σ m ℓ / (N · max_completion_length)    (constant normaliser, no length bias)
    With μ = 1 (old = current, detached) ρ = 1 and the loss value is −mean(A) ≈ 0 while the gradient is
    not: that is why GRPO's logged loss sits near zero.
    """
    check_choice("loss_type", loss_type, LOSS_TYPES)
    check_choice("importance_sampling_level", importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
    mask = mask.to(logp.dtype)
    eps_high = epsilon if epsilon_high is None else epsilon_high
    adv = advantages.unsqueeze(1)
    ratio = importance_ratio(logp, old_logp, mask, importance_sampling_level)
    if loss_type == "cispo":
        per_token = -torch.clamp(ratio, max=1.0 + eps_high).detach() * adv * logp
    else:
        clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + eps_high)
        per_token = -torch.min(ratio * adv, clipped * adv)
    stats: dict[str, torch.Tensor] = {}
    if ref_logp is not None:
        kl = kl_estimate(logp, ref_logp, kl_estimator)
        stats["kl"] = masked_mean(kl.detach(), mask)
        if isinstance(beta, torch.Tensor) or beta != 0.0:  # a tensor β (XLA) is always in the graph, even at 0
            per_token = per_token + beta * kl
    if entropy is not None:
        stats["entropy"] = masked_mean(entropy.detach(), mask)
        if entropy_coef != 0.0:
            per_token = per_token - entropy_coef * entropy
    loss = aggregate_loss(per_token, mask, loss_type, total_sequences=total_sequences or logp.shape[0],
                          total_tokens=total_tokens, max_completion_length=max_completion_length)
    stats["clip_low"] = masked_mean(((ratio < 1.0 - epsilon) & (adv < 0)).to(mask.dtype), mask)
    stats["clip_high"] = masked_mean(((ratio > 1.0 + eps_high) & (adv > 0)).to(mask.dtype), mask)
    stats["ratio_mean"] = masked_mean(ratio.detach(), mask)
    return loss, stats


def importance_ratio(
    logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str = "token"
) -> torch.Tensor:
    """ρ_t = exp(log π_t − log π_old,t) per token, or per sequence (GSPO) the same for every token of row i:
    ρ_i = exp(Σ_t m_t (log π_t − log π_old,t) / Σ_t m_t). The log-ratio is clamped at 20 before exp."""
    log_ratio = logp - old_logp
    if level == "sequence":
        seq = (log_ratio * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
        log_ratio = seq.expand_as(logp)
    return torch.exp(log_ratio.clamp(max=20.0))


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, *, total_sequences: int,
                   total_tokens: torch.Tensor | float | None = None,
                   max_completion_length: int | None = None) -> torch.Tensor:
    """One (micro-)batch's share of the step loss from per-token losses ℓ (B, T); the formulas are in
    `policy_loss`. `total_tokens` None = this micro-batch's; `max_completion_length` None = T."""
    if loss_type == "grpo":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / total_sequences
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1) * (per_token.shape[0] / total_sequences)
    if loss_type in ("dapo", "cispo"):
        tokens = mask.sum() if total_tokens is None else total_tokens
        return (per_token * mask).sum() / torch.as_tensor(tokens).clamp(min=1)
    check_choice("loss_type", loss_type, LOSS_TYPES)
    return (per_token * mask).sum() / (total_sequences * (max_completion_length or per_token.shape[1]))  # dr_grpo


def adaptive_beta(beta: float, kl: float, target_kl: float, rate: float = 0.1, floor: float = 1e-4) -> float:
    """Adaptive KL controller (Ziegler et al. 2019): e = clip(KL / target − 1, −0.2, 0.2),
    β ← max(β, floor) · (1 + rate · e). Raises β when KL runs above target, lowers it below."""
    if target_kl <= 0:
        raise ValueError(f"target_kl must be > 0, got {target_kl}")
    error = min(max(kl / target_kl - 1.0, -0.2), 0.2)
    return max(beta, floor) * (1.0 + rate * error)
