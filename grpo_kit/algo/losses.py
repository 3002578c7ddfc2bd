"""KL estimators and the GRPO-family policy losses: pure tensor functions of log-probabilities (which
`engine/logprobs.py` computes), each docstring giving its formula. The losses are registered by name (`LOSSES`),
and so are the KL estimators (`KL_ESTIMATORS`): the settings' checks read their names from these registries.

Shapes: B sequences × T completion tokens. `mask` (B, T) is 1 on real completion tokens (up to and
including the stop token) and 0 after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..options import check_choice


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ m·x / max(Σ m, 1)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def _k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return -(ref_logp - logp).clamp(-20.0, 20.0)


def _k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    diff = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(diff) - diff - 1.0


KL_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k1": _k1, "k3": _k3}
"""The per-token KL estimators by name (`kl_estimate` gives their formulas)."""


def kl_estimate(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π (Schulman, "Approximating KL divergence"):

        k1 = log π − log π_ref                      (unbiased, high variance, can be negative)
        k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1   (unbiased, ≥ 0, low variance)

    The log-ratio is clamped to ±20 before exp so a single wild token cannot overflow (bf16 especially).
    """
    check_choice("KL estimator", estimator, KL_ESTIMATORS)
    return KL_ESTIMATORS[estimator](logp, ref_logp)


class StepTotals(NamedTuple):
    """The whole step's batch, which a micro-batch's share of the loss is normalised by."""

    sequences: int
    """N, the sequences in the step's batch (groups left out of the update included)."""
    tokens: torch.Tensor | float | None = None
    """The step's completion tokens under the mask (dapo, cispo); None = the micro-batch's own."""


def _sequence_mean(per_token: torch.Tensor, mask: torch.Tensor, totals: StepTotals, max_len: int) -> torch.Tensor:
    return ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).sum() / totals.sequences


def _local_token_mean(per_token: torch.Tensor, mask: torch.Tensor, totals: StepTotals, max_len: int) -> torch.Tensor:
    return (per_token * mask).sum() / mask.sum().clamp(min=1) * (per_token.shape[0] / totals.sequences)


def _global_token_mean(per_token: torch.Tensor, mask: torch.Tensor, totals: StepTotals, max_len: int) -> torch.Tensor:
    tokens = mask.sum() if totals.tokens is None else totals.tokens
    return (per_token * mask).sum() / torch.as_tensor(tokens).clamp(min=1)


def _constant_normaliser(per_token: torch.Tensor, mask: torch.Tensor, totals: StepTotals, max_len: int) -> torch.Tensor:
    return (per_token * mask).sum() / (totals.sequences * max_len)


@dataclass(frozen=True)
class LossType:
    """One registered policy loss: its per-token objective and how it sums over the step's batch."""

    objective: str
    """`ppo_clip`: −min(ρ A, clip(ρ) A); `cispo`: −sg[min(ρ, 1 + ε_h)] A log π."""
    aggregate: Callable[[torch.Tensor, torch.Tensor, StepTotals, int], torch.Tensor]
    """(per-token ℓ, mask, the step's totals, max completion length) → this micro-batch's share of the loss."""
    normalised_by_the_whole_batch: bool
    """Its normaliser is the whole step's (not the micro-batch's): leaving out rows whose terms are exactly 0 then
    leaves the loss and its gradient unchanged, which the update's skipping of zero-advantage groups relies on."""


LOSSES: dict[str, LossType] = {
    "grpo": LossType("ppo_clip", _sequence_mean, True),
    "bnpo": LossType("ppo_clip", _local_token_mean, False),
    "dapo": LossType("ppo_clip", _global_token_mean, True),
    "dr_grpo": LossType("ppo_clip", _constant_normaliser, True),
    "cispo": LossType("cispo", _global_token_mean, True),
}
"""The policy losses by name (`policy_loss` gives their formulas)."""

IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
"""Where the importance ratio is taken: per token, or per sequence (GSPO)."""


@dataclass(frozen=True)
class LossSpec:
    """The policy loss's settings for one step: which loss, its clip range, the KL and entropy terms. Checked when
    made: a name that is not registered raises a one-line ValueError naming the allowed ones."""

    loss_type: str = "grpo"
    """A name in `LOSSES`."""
    epsilon: float = 0.2
    """ε_l, the lower clip range (and the upper one when `epsilon_high` is None)."""
    epsilon_high: float | None = None
    """ε_h, the upper clip range (DAPO's clip-higher); None = `epsilon`."""
    importance_sampling_level: str = "token"
    """`token` (GRPO) or `sequence` (GSPO)."""
    beta: float | torch.Tensor = 0.0
    """β, the KL term's weight (a tensor on XLA, where it is a live control in the graph)."""
    kl_estimator: str = "k3"
    """A name in `KL_ESTIMATORS`."""
    entropy_coef: float = 0.0
    """The entropy bonus's weight."""
    max_completion_length: int | None = None
    """dr_grpo's constant normaliser; None = the batch's T."""

    def __post_init__(self) -> None:
        check_choice("loss_type", self.loss_type, LOSSES)
        check_choice("importance_sampling_level", self.importance_sampling_level, IMPORTANCE_SAMPLING_LEVELS)
        check_choice("KL estimator", self.kl_estimator, KL_ESTIMATORS)

    @property
    def kl_in_loss(self) -> bool:
        """β·KL is a term of the loss (a tensor β is always in the graph, even at 0)."""
        return isinstance(self.beta, torch.Tensor) or self.beta != 0.0

    @property
    def entropy_in_gradient(self) -> bool:
        """The entropy's gradient is part of the loss's: the log-prob paths must carry it."""
        return self.entropy_coef != 0.0

    @property
    def rows_with_zero_terms_can_be_left_out(self) -> bool:
        """A row whose advantage is 0 contributes exactly 0 to the loss and its gradient: no KL or entropy term,
        and a normaliser taken over the whole batch (`LossType.normalised_by_the_whole_batch`)."""
        return (not self.kl_in_loss and not self.entropy_in_gradient
                and LOSSES[self.loss_type].normalised_by_the_whole_batch)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    spec: LossSpec | None = None,
    *,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    totals: StepTotals | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO-family loss for one (micro-)batch under `spec` (default `LossSpec()`); returns (loss, stats), all on the
    input device. `totals`: the whole step's batch (default: this micro-batch alone).

    Importance ratio, per token (`token`) or per sequence (`sequence`, GSPO):
        ρ_t = exp(log π_t − log π_old,t)          or  ρ_i = exp(Σ_t m_t (log π_t − log π_old,t) / Σ_t m_t)
    Per-token objective with ε_l = epsilon, ε_h = epsilon_high (or epsilon):
        PPO-clip (grpo, bnpo, dapo, dr_grpo):  ℓ_t = −min(ρ_t A_i, clip(ρ_t, 1 − ε_l, 1 + ε_h) A_i)
        CISPO:                                 ℓ_t = −sg[min(ρ_t, 1 + ε_h)] · A_i · log π_t
    plus β·KL_t (k1 or k3 against π_ref) and − entropy_coef·H_t.
    Aggregation over the whole step's batch (so micro-batch losses add up to the full-batch loss):
        grpo:     (1/N) Σ_i (Σ_t m ℓ / Σ_t m)           N = totals.sequences
        bnpo:     Σ m ℓ / Σ m  of this micro-batch, × (B / N)   (local token mean, averaged)
        dapo, cispo: Σ m ℓ / totals.tokens               (global token mean)
        dr_grpo:  Σ m ℓ / (N · max_completion_length)    (constant normaliser, no length bias)
    With μ = 1 (old = current, detached) ρ = 1 and the loss value is −mean(A) ≈ 0 while the gradient is
    not: that is why GRPO's logged loss sits near zero.
    """
    spec = spec or LossSpec()
    mask = mask.to(logp.dtype)
    eps_high = spec.epsilon if spec.epsilon_high is None else spec.epsilon_high
    adv = advantages.unsqueeze(1)
    ratio = importance_ratio(logp, old_logp, mask, spec.importance_sampling_level)
    if LOSSES[spec.loss_type].objective == "cispo":
        per_token = -torch.clamp(ratio, max=1.0 + eps_high).detach() * adv * logp
    else:
        clipped = torch.clamp(ratio, 1.0 - spec.epsilon, 1.0 + eps_high)
        per_token = -torch.min(ratio * adv, clipped * adv)
    stats: dict[str, torch.Tensor] = {}
    if ref_logp is not None:
        kl = kl_estimate(logp, ref_logp, spec.kl_estimator)
        stats["kl"] = masked_mean(kl.detach(), mask)
        if spec.kl_in_loss:
            per_token = per_token + spec.beta * kl
    if entropy is not None:
        stats["entropy"] = masked_mean(entropy.detach(), mask)
        if spec.entropy_in_gradient:
            per_token = per_token - spec.entropy_coef * entropy
    loss = aggregate_loss(per_token, mask, spec.loss_type, totals=totals or StepTotals(logp.shape[0]),
                          max_completion_length=spec.max_completion_length)
    stats["clip_low"] = masked_mean(((ratio < 1.0 - spec.epsilon) & (adv < 0)).to(mask.dtype), mask)
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


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, *, totals: StepTotals,
                   max_completion_length: int | None = None) -> torch.Tensor:
    """One (micro-)batch's share of the step loss from per-token losses ℓ (B, T), by `loss_type`'s registered
    aggregation (the formulas are in `policy_loss`). `max_completion_length` None = T."""
    check_choice("loss_type", loss_type, LOSSES)
    return LOSSES[loss_type].aggregate(per_token, mask, totals, max_completion_length or per_token.shape[1])


def adaptive_beta(beta: float, kl: float, target_kl: float, rate: float = 0.1, floor: float = 1e-4) -> float:
    """Adaptive KL controller (Ziegler et al. 2019): e = clip(KL / target − 1, −0.2, 0.2),
    β ← max(β, floor) · (1 + rate · e). Raises β when KL runs above target, lowers it below."""
    if target_kl <= 0:
        raise ValueError(f"target_kl must be > 0, got {target_kl}")
    error = min(max(kl / target_kl - 1.0, -0.2), 0.2)
    return max(beta, floor) * (1.0 + rate * error)
