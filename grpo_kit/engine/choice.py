"""Choosing the next token from a row of logits, as pure tensor functions: the temperature floor, top-k and top-p
filters, the two-level inverse-CDF draw (`inverse_cdf`, `choose_tokens`), and the head's moments the update may
reuse (`head_moments`). The sampler (`sampling`) draws through these; the CPU's streamed head
(`cpu.streamed_head`) gives the same tokens without materialising the logits."""

from __future__ import annotations

from typing import NamedTuple

import torch

SAMPLE_BLOCK = 512
"""Tokens per block of the two-level inverse-CDF search (`inverse_cdf`)."""


MIN_TEMPERATURE = 1e-5
"""Temperatures are floored here before dividing logits by them (0 would divide by zero; greedy is its own mode)."""


def floored_temperature(temperature: float | torch.Tensor) -> float | torch.Tensor:
    """max(T, MIN_TEMPERATURE), for a number or a device tensor (a live control on XLA)."""
    if isinstance(temperature, torch.Tensor):
        return temperature.clamp(min=MIN_TEMPERATURE)
    return max(float(temperature), MIN_TEMPERATURE)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The sampled index per row: the number of v with Σ_{w ≤ v} p_w < u · Σ_w p_w (`probs` (..., V), `u` (...)).

    Found in two levels: the mass of each block of SAMPLE_BLOCK entries and their running sum pick the block where
    the running mass crosses the target, then a running sum inside that block alone picks the entry. The result is
    that of one prefix sum over the whole vocabulary, without one: on XLA under SPMD a prefix sum over Gemma's 262k
    vocabulary, fed by the softmax, costs seconds per sampled token; two of at most 512 entries cost milliseconds."""
    shape, vocab = probs.shape[:-1], probs.shape[-1]
    flat, u = probs.reshape(-1, vocab), u.reshape(-1).to(probs.dtype)
    rows, blocks = flat.shape[0], -(-vocab // SAMPLE_BLOCK)
    width = min(SAMPLE_BLOCK, vocab)
    padding = blocks * width - vocab  # none for Gemma's 262,144 = 512²: no copy of the probabilities then
    tiles = (torch.nn.functional.pad(flat, (0, padding)) if padding else flat).view(rows, blocks, width)
    block_cdf = tiles.sum(-1).cumsum(-1)  # (rows, blocks)
    target = u * block_cdf[:, -1]
    block = (block_cdf < target.unsqueeze(-1)).sum(-1).clamp(max=blocks - 1)
    mass_before = torch.cat([torch.zeros_like(block_cdf[:, :1]), block_cdf[:, :-1]], 1).gather(1, block.unsqueeze(1))
    inside = tiles.gather(1, block.view(rows, 1, 1).expand(rows, 1, width)).squeeze(1).cumsum(-1) + mass_before
    tokens = block * width + (inside < target.unsqueeze(-1)).sum(-1)
    return tokens.clamp(max=vocab - 1).view(shape)


def choose_tokens(
    logits: torch.Tensor, temperature: float | torch.Tensor, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (tokens, log-prob under the temperature-scaled distribution).

    Sampling is by inverse CDF over the filtered distribution p: with one u ~ U(0, 1) per row,

        token = #{v : Σ_{w ≤ v} p_w < u · Σ_w p_w}        (`inverse_cdf`)

    — no multinomial, no host sync, and one random number per row and step, so a whole rollout's noise is
    a (B, N) tensor that can be drawn on the CPU (same tokens on every backend) and sent to the device once.
    `uniforms` (B,) may be supplied; otherwise they are drawn on the logits' device.
    """
    logits = logits.float()
    scaled = logits / floored_temperature(temperature)
    logprobs = torch.log_softmax(scaled, dim=-1)
    if greedy:
        tokens = logits.argmax(dim=-1)
    else:
        filtered = scaled
        if top_k and top_k < filtered.shape[-1]:
            kth = torch.topk(filtered, top_k, dim=-1).values[..., -1:]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        if top_p < 1.0:
            sorted_logits, order = torch.sort(filtered, dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # drop a token when the mass before it already reaches top_p (the top token always stays)
            drop_sorted = (probs.cumsum(-1) - probs) >= top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            filtered = filtered.masked_fill(drop, float("-inf"))
        probs = torch.softmax(filtered, dim=-1)
        u = uniforms if uniforms is not None else torch.rand(probs.shape[:-1], device=probs.device)
        tokens = inverse_cdf(probs, u)
        if filtered is not scaled:
            # a token of probability 0 (filtered out) can only be hit through rounding at a flat stretch of
            # the CDF; step back to the last token with mass
            tokens = torch.where(
                torch.isinf(filtered.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)), filtered.argmax(-1), tokens
            )
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class HeadMoments(NamedTuple):
    """What the update needs from the LM head at a sampled position, computed while sampling it."""

    mean_row: torch.Tensor
    """(B, d) Σ_v π_v W_v: the LM head's rows weighted by the temperature-scaled policy."""
    entropy: torch.Tensor
    """(B,) H = logsumexp(z) − Σ_v π_v z_v."""


def head_moments(logits: torch.Tensor, weight: torch.Tensor, temperature: float | torch.Tensor) -> HeadMoments:
    """`HeadMoments` from full logits (B, V) = h Wᵀ (no final softcap: with one, ∂z/∂h is not W):
    π = softmax(z/T), mean_row = π W, H = logsumexp(z/T) − Σ π z/T."""
    t = floored_temperature(temperature)
    z = logits.float() / t
    logp = torch.log_softmax(z, dim=-1)
    probs = logp.exp()
    return HeadMoments(probs @ weight.float(), -(probs * logp).sum(-1))

