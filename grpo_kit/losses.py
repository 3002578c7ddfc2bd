"""Log-probabilities, KL estimators and the GRPO-family policy losses: pure tensor functions.

Shapes: B sequences × T completion tokens. `mask` (B, T) is 1 on real completion tokens (up to and
including the stop token) and 0 after it.
"""

from __future__ import annotations

import functools

import torch

from .device import activation_checkpoint, data_parallel_size, is_xla
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
    *,
    entropy_grad: bool = True,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π(y_t) and entropy H_t from final hidden states, chunk by chunk of sequences:

        z = softcap·tanh((h Wᵀ)/softcap) / T,   log π(y_t) = z[y_t] − logsumexp(z),
        H_t = logsumexp(z) − Σ_v softmax(z)_v z_v

    Never materialises a full-vocabulary log-softmax, and never the whole batch's logits at once: with
    Gemma's 262k vocabulary one (128 × 256) batch of logits would be 34 GB in fp32. `chunk_rows` None sizes
    chunks to `LOGIT_CHUNK_ELEMENTS` logits (`logit_chunks`: by rows, on XLA by positions). `with_entropy=False`
    skips the entropy (returned as zeros), which costs a full softmax product per position. With `recompute`
    (default: on when grads are needed and the vocabulary is ≥ 32k) each chunk's logits are recomputed in
    the backward pass, so only the hidden states are kept.

    `fused` (default: when W is frozen — LoRA, or no grad — the vocabulary is ≥ 32k and the device is not XLA)
    takes `frozen_head_logprobs` instead: the same values in two matrix products per token and no
    full-vocabulary passes. `entropy_grad=False` tells it that no gradient will flow through H_t (saving a
    third product); H_t is then returned detached.
    """
    if hidden.shape[:2] != ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and ids {tuple(ids.shape)} disagree on (B, T)")
    if fused is None:
        fused = not lm_head_weight.requires_grad and lm_head_weight.shape[0] >= 32768 and hidden.device.type != "xla"
    if fused:
        logp, entropy = frozen_head_logprobs(hidden.reshape(-1, hidden.shape[-1]), lm_head_weight, ids.reshape(-1),
                                             temperature=temperature, softcap=softcap, entropy_grad=entropy_grad)
        entropy = entropy.view_as(ids) if with_entropy else torch.zeros_like(ids, dtype=logp.dtype)
        return logp.view_as(ids), entropy
    if recompute is None:
        recompute = torch.is_grad_enabled() and lm_head_weight.shape[0] >= 32768
    chunks, dim = logit_chunks(ids.shape, lm_head_weight.shape[0], chunk_rows=chunk_rows, xla=is_xla(hidden.device))
    stats = functools.partial(_chunk_stats, temperature=temperature, softcap=softcap, with_entropy=with_entropy)
    logps, ents = [], []
    for chunk in chunks:
        h, y = hidden[chunk], ids[chunk]
        lp, ent = activation_checkpoint(stats, h, lm_head_weight, y) if recompute else stats(h, lm_head_weight, y)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps, dim), torch.cat(ents, dim)


FUSED_ROWS, FUSED_COLUMNS = 256, 16384
"""Block of the fused LM head: 256 tokens × 16,384 vocabulary entries (16 MiB of fp32 logits) at a time,
the fastest of the sizes `grpo-kit bench` tries on a 2-core CPU; each block is used while it is in cache."""


def _frozen_head_block(hidden: torch.Tensor, weight: torch.Tensor, *, temperature: float, softcap: float | None,
                       entropy_grad: bool) -> tuple[torch.Tensor, ...]:
    """Over the vocabulary in blocks, with a running maximum (online softmax), for rows h of `hidden`:
    lse = logsumexp(z), z̄ = Σ p z, E = Σ_v p_v c_v W_v and (entropy_grad) E_z = Σ_v p_v (z_v − z̄) c_v W_v,
    where p = softmax(z) and c_v = ∂z_v/∂(h·W_v)·T (1 without a softcap, 1 − tanh²(h·W_v/softcap) with one)."""
    rows, width = hidden.shape[0], hidden.shape[1]
    m = hidden.new_full((rows, 1), float("-inf"), dtype=torch.float32)
    total, total_z = (hidden.new_zeros((rows, 1), dtype=torch.float32) for _ in range(2))
    expect, expect_z = (hidden.new_zeros((rows, width), dtype=torch.float32) for _ in range(2))
    # block-sized buffers written in place: a fresh 16 MiB tensor per operation costs more in page faults
    # than the operation itself on a CPU
    z_buffer, p_buffer, pz_buffer = (hidden.new_empty((rows, FUSED_COLUMNS), dtype=torch.float32) for _ in range(3))
    for start in range(0, weight.shape[0], FUSED_COLUMNS):
        w = weight[start : start + FUSED_COLUMNS]
        cols = w.shape[0]
        z, p = z_buffer[:, :cols], p_buffer[:, :cols]
        if hidden.dtype == torch.float32 and cols == FUSED_COLUMNS:
            torch.mm(hidden, w.T, out=z)
        else:
            z.copy_(torch.mm(hidden, w.T))
        if softcap:
            z.div_(softcap).tanh_()
            slope = 1 - z * z
            z.mul_(softcap)
        if temperature != 1.0:
            z.div_(temperature)
        m_new = torch.maximum(m, z.amax(1, keepdim=True))
        rescale = torch.exp(m - m_new)
        torch.sub(z, m_new, out=p).exp_()
        m = m_new
        total = total * rescale + p.sum(1, keepdim=True)
        total_z = total_z * rescale + torch.mul(p, z, out=pz_buffer[:, :cols]).sum(1, keepdim=True)
        if softcap:
            p.mul_(slope)
        w32 = w.float()
        expect = expect * rescale + torch.mm(p, w32)
        if entropy_grad:
            expect_z = expect_z * rescale + torch.mm(p.mul_(z), w32)
    mean_z = total_z / total
    expect = expect / total
    expect_z = expect_z / total - mean_z * expect if entropy_grad else None
    return (m + torch.log(total)).squeeze(1), mean_z.squeeze(1), expect, expect_z


class _FrozenHeadLogprobs(torch.autograd.Function):
    """log π(y_t) and H_t with the gradient to the hidden states only (W frozen):
    ∂log π(y_t)/∂h_t = (c_y W_y − E_t)/T and ∂H_t/∂h_t = −E_z,t/T, both kept from the forward pass."""

    @staticmethod
    def forward(ctx, hidden, weight, ids, settings):  # noqa: ANN001, ANN205
        temperature, softcap, entropy_grad = settings
        target_w = weight[ids].float()
        target = (hidden.float() * target_w).sum(1)  # h·W_y
        if softcap:
            capped = torch.tanh(target / softcap)
            target, target_w = softcap * capped, target_w * (1 - capped * capped).unsqueeze(1)
        blocks = [_frozen_head_block(hidden[s : s + FUSED_ROWS], weight, temperature=temperature, softcap=softcap,
                                     entropy_grad=entropy_grad) for s in range(0, hidden.shape[0], FUSED_ROWS)]
        lse, mean_z, expect = (torch.cat([b[i] for b in blocks]) for i in range(3))
        expect_z = torch.cat([b[3] for b in blocks]) if entropy_grad else None
        ctx.save_for_backward(target_w - expect, expect_z)
        ctx.temperature, ctx.dtype = temperature, hidden.dtype
        return target / temperature - lse, lse - mean_z

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):  # noqa: ANN001, ANN205
        logp_slope, expect_z = ctx.saved_tensors
        grad = grad_logp.unsqueeze(1) * logp_slope
        if expect_z is not None and grad_entropy is not None:
            grad = grad - grad_entropy.unsqueeze(1) * expect_z
        return (grad / ctx.temperature).to(ctx.dtype), None, None, None


def frozen_head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                         softcap: float | None = None, entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(y_t), H_t) for N hidden states (N, d) through a frozen LM head W (V, d), as `token_logprobs_and_entropy`
    defines them, fused: per block of tokens and vocabulary entries, z = hWᵀ, an online logsumexp, and the
    p-weighted sum of W's rows E_t = Σ_v p_v W_v that the gradient needs — two matrix products per token (three
    with `entropy_grad`), where computing logits, then recomputing them for the backward pass, then
    multiplying the logits' gradient by W takes three, plus a dozen passes over N × V logits in memory.
    Gradients reach `hidden` only. `entropy_grad=False`: H_t is returned detached."""
    if weight.requires_grad and torch.is_grad_enabled():
        raise ValueError("frozen_head_logprobs: the LM head weight requires grad (full fine-tuning); use token_logprobs_and_entropy")
    logp, entropy = _FrozenHeadLogprobs.apply(hidden, weight.detach(), ids, (temperature, softcap, entropy_grad))
    return logp, entropy if entropy_grad else entropy.detach()


def logprobs_from_head_mean(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *, logprobs: torch.Tensor,
                            head_mean: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    """log π(y_t) through a frozen LM head W (no softcap) from what the sampler kept when it drew y_t from the same
    policy: its log-prob and the expected head row E_t = Σ_v π_v W_v (`sampling.HeadMoments`). No pass over the
    vocabulary:

        log π(y_t) = logprobs_t + (h_t − sg(h_t)) · (W_{y_t} − E_t) / T

    Its value is `logprobs`; its gradient with respect to h_t is (W_{y_t} − E_t)/T, the exact gradient of
    log softmax(h_t Wᵀ/T)_{y_t} — so long as h_t is the hidden state the sampler saw (the same weights, no dropout),
    up to float summation order. Shapes: hidden (…, d), ids/logprobs (…), head_mean (…, d)."""
    rows = torch.nn.functional.embedding(ids, weight.detach()).float()
    return logprobs + ((hidden.float() - hidden.float().detach()) * (rows - head_mean)).sum(-1) / temperature


LOGIT_CHUNK_ELEMENTS = 2**27
"""Logits computed at once: 2²⁷ fp32 values = 512 MiB (the tiny model's 106-token vocabulary fits whole
batches; Gemma's 262k vocabulary gets 2 rows of 256 tokens per chunk)."""


def logit_chunk_rows(tokens_per_row: int, vocab: int, budget: int = LOGIT_CHUNK_ELEMENTS) -> int:
    """Rows per chunk so that one chunk's logits stay within `budget` elements (at least 1 row)."""
    return max(1, budget // max(1, tokens_per_row * vocab))


def logit_chunks(shape: tuple[int, int] | torch.Size, vocab: int, *, chunk_rows: int | None = None,
                 xla: bool = False) -> tuple[list[tuple[slice, slice]], int]:
    """How `token_logprobs_and_entropy` cuts a (B, T) batch so that one chunk's logits stay within
    `LOGIT_CHUNK_ELEMENTS` (or `chunk_rows` rows' worth): (index of each chunk, the dimension they join along).
    Off XLA by rows. On XLA by positions, every chunk holding the whole batch: under SPMD the batch is split over
    the devices, and a chunk of its rows makes XLA's SPMD partitioner stop the process (a failed check, torch_xla
    2.8 and 2.9); the budget then counts one device's share of the rows."""
    rows, positions = shape
    if not xla:
        chunk_rows = chunk_rows or logit_chunk_rows(positions, vocab, budget=LOGIT_CHUNK_ELEMENTS)
        return [(slice(s, s + chunk_rows), slice(None)) for s in range(0, rows, chunk_rows)], 0
    rows_per_device = -(-rows // data_parallel_size())
    if chunk_rows:  # the logits of `chunk_rows` whole rows on each device
        columns = chunk_rows * positions // rows_per_device
    else:
        columns = LOGIT_CHUNK_ELEMENTS // (rows_per_device * vocab)
    columns = min(positions, max(1, columns))
    return [(slice(None), slice(s, s + columns)) for s in range(0, positions, columns)], 1


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
