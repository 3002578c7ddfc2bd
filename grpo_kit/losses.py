"""Log-probabilities, KL estimators and the GRPO-family policy losses: pure tensor functions.

Shapes: B sequences × T completion tokens. `mask` (B, T) is 1 on real completion tokens (up to and
including the stop token) and 0 after it.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from .options import IMPORTANCE_SAMPLING_LEVELS, KL_ESTIMATORS, LOSS_TYPES, check_choice


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float, softcap: float | None) -> torch.Tensor:
    logits = (hidden @ weight.T).float()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return logits / temperature


def _chunk_stats(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, temperature: float,
                 softcap: float | None = None, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _logits(hidden, weight, temperature, softcap)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def token_logprobs_and_entropy(
    hidden: torch.Tensor,
    lm_head_weight: torch.Tensor,
    ids: torch.Tensor,
    temperature: float = 1.0,
    softcap: float | None = None,
    chunk_rows: int | None = None,
    recompute: bool | None = None,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π(y_t) and entropy H_t from final hidden states, chunk by chunk of sequences:

        z = softcap·tanh((h Wᵀ)/softcap) / T,   log π(y_t) = z[y_t] − logsumexp(z),
        H_t = logsumexp(z) − Σ_v softmax(z)_v z_v

    Never materialises a full-vocabulary log-softmax, and never the whole batch's logits at once: with
    Gemma's 262k vocabulary one (128 × 256) batch of logits would be 34 GB in fp32. `chunk_rows` None sizes
    chunks to `LOGIT_CHUNK_ELEMENTS` logits. `with_entropy=False`
    skips the entropy (returned as zeros), which costs a full softmax product per position. With `recompute`
    (default: on when grads are needed and the vocabulary is ≥ 32k) each chunk's logits are recomputed in
    the backward pass, so only the hidden states are kept.
    """
    if hidden.shape[:2] != ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and ids {tuple(ids.shape)} disagree on (B, T)")
    if recompute is None:
        recompute = torch.is_grad_enabled() and lm_head_weight.shape[0] >= 32768
    if chunk_rows is None:
        chunk_rows = logit_chunk_rows(ids.shape[1], lm_head_weight.shape[0])
    logps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_rows):
        h, y = hidden[start : start + chunk_rows], ids[start : start + chunk_rows]
        if recompute:
            lp, ent = checkpoint(_chunk_stats, h, lm_head_weight, y, temperature, softcap, with_entropy, use_reentrant=False)
        else:
            lp, ent = _chunk_stats(h, lm_head_weight, y, temperature, softcap=softcap, with_entropy=with_entropy)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps), torch.cat(ents)


LOGIT_CHUNK_ELEMENTS = 2**27
"""Logits computed at once: 2²⁷ fp32 values = 512 MiB (the tiny model's 106-token vocabulary fits whole
batches; Gemma's 262k vocabulary gets 2 rows of 256 tokens per chunk)."""


def logit_chunk_rows(tokens_per_row: int, vocab: int, budget: int = LOGIT_CHUNK_ELEMENTS) -> int:
    """Rows per chunk so that one chunk's logits stay within `budget` elements (at least 1 row)."""
    return max(1, budget // max(1, tokens_per_row * vocab))


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


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor, level: str = "token") -> torch.Tensor:
    """ρ_t = exp(log π_t − log π_old,t) per token, or per sequence (GSPO) the same for every token of row i:
    ρ_i = exp(Σ_t m_t (log π_t − log π_old,t) / Σ_t m_t). The log-ratio is clamped at 20 before exp."""
    log_ratio = logp - old_logp
    if level == "sequence":
        seq = (log_ratio * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True).clamp(min=1)
        log_ratio = seq.expand_as(logp)
    return torch.exp(log_ratio.clamp(max=20.0))


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, *, total_sequences: int,
                   total_tokens: torch.Tensor | float | None = None, max_completion_length: int | None = None) -> torch.Tensor:
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
