"""The LM head streamed through the draw (`draw_from_head`): a decode step's token chosen from h Wᵀ block by block
of W, so the (rows × vocabulary) logits never leave the cache, with the head's moments (π W, H) for the update when
asked. The same tokens and log-probs as `choice.choose_tokens` on the full logits (its reference), up to float
rounding; the sampler uses it for plain sampling or greedy with a large head on the CPU (`sampling.HeadInput`)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from ..choice import SAMPLE_BLOCK, HeadMoments, floored_temperature
from .products import cpu_prepacked_products, prepack_weight, prepacked_linear

DRAW_BLOCK = 16384
"""Vocabulary entries per block of `draw_from_head` (a 16384 × 640 bf16 block is 20 MiB; its fp32 logits for 32 rows
2 MiB): larger blocks mean fewer, larger products and fewer small ops per decode step."""

MOMENT_FLOOR = 2.0**-25
"""A SAMPLE_BLOCK-entry tile of the vocabulary whose share of every row's probability mass is below this (≈ 3e-8)
is left out of the moments' product π W: at most V / SAMPLE_BLOCK such tiles (512 for Gemma's 262,144 entries), so
at most 512 · 2⁻²⁵ = 2⁻¹⁶ ≈ 1.5e-5 of a row's mass is missing from its E = π W (bf16 rounding alone is 2⁻⁹).
After SFT a decode step's rows hold more than that in a few dozen of Gemma's 512 tiles, in a few of its 16
DRAW_BLOCK blocks (docs/architecture.md): each tile left out is 512 rows of the head not read."""

EXP_FLOOR = -87.0
"""`draw_from_head` takes e^{z − m_b} of z − m_b ≥ −87 (e^−87 ≈ 1.6e-38, the smallest normal fp32 is 1.2e-38): the
logits far below a block's maximum would otherwise give subnormal floats, which x86 multiplies and adds through
microcode assists, making the moments' product over such a block several times slower (docs/cpu_choices.md). Each such
entry then adds ≤ 1.6e-38 to masses of at least 1, which fp32 cannot represent: the same masses, tokens and moments."""

_HEAD_CASTS: dict[str, Any] = {}
_HEAD_PACKS: dict[str, Any] = {}


def _kept_for(store: dict[str, Any], weight: torch.Tensor, extra: tuple, make: Callable[[torch.Tensor], Any]) -> Any:
    """`make(W)`, kept in `store` for one W at a time while W is unchanged — the same tensor, storage and version (an
    optimizer step or a load bumps the version) — so a frozen head (LoRA) is made once per run, not per rollout."""
    key = (id(weight), weight.data_ptr(), weight._version, *extra)
    ref = store.get("ref")
    if store.get("key") != key or ref is None or ref() is not weight:
        store.clear()  # the old copies go before the new ones are made
        store.update(key=key, ref=weakref.ref(weight, lambda _: store.clear()), value=make(weight.detach()))
    return store["value"]


def head_casts(
    weight: torch.Tensor, dtype: torch.dtype, *, transposed: bool
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The LM head's weight W (V, d) as `draw_from_head` multiplies it: in `dtype` (None where that is W's own) and,
    with `transposed`, also Wᵀ as a contiguous (d, V) copy in that dtype for the moments' product (else None).
    Kept while W is unchanged (`_kept_for`): a frozen head is cast once per run instead of once per rollout."""

    def make(w: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        cast = w.to(dtype) if dtype != w.dtype else None
        return cast, (w if cast is None else cast).T.contiguous() if transposed else None

    return _kept_for(_HEAD_CASTS, weight, (dtype, transposed), make)


def head_packs(weight: torch.Tensor) -> list[torch.Tensor] | None:
    """The head's weight as `draw_from_head` multiplies it (`head_casts`), its DRAW_BLOCK-entry blocks each prepacked
    for oneDNN (`products.prepack_weight`: as much memory again as that weight), or None where products stay plain.
    Kept while that weight is unchanged (`_kept_for`)."""

    def make(w: torch.Tensor) -> list[torch.Tensor] | None:
        packs = [prepack_weight(w[start : start + DRAW_BLOCK]) for start in range(0, w.shape[0], DRAW_BLOCK)]
        return None if any(p is None for p in packs) else packs

    return _kept_for(_HEAD_PACKS, weight, (), make) if cpu_prepacked_products() else None


class HeadWeights(NamedTuple):
    """The LM head's weight W (V, d) in the forms `draw_from_head` multiplies: W itself, in the products' dtype (a
    bf16 copy of an fp32 head where a CPU multiplies bf16 natively: `head_casts`), and optionally Wᵀ and W's
    prepacked blocks, which change only how the products run."""

    weight: torch.Tensor
    """W (V, d)."""
    transposed: torch.Tensor | None = None
    """Wᵀ as a contiguous (d, V) copy in W's dtype (`head_casts(transposed=True)`), for the moments' product; None =
    the product through W."""
    packs: list[torch.Tensor] | None = None
    """W's DRAW_BLOCK-entry blocks prepacked for oneDNN (`head_packs`); None = plain products."""


def draw_from_head(hidden: torch.Tensor, head: HeadWeights, *, temperature: float | torch.Tensor,
                   softcap: float | None, greedy: bool, uniforms: torch.Tensor | None, moments: bool = False,
                   ) -> tuple[torch.Tensor, torch.Tensor, HeadMoments | None]:
    """`choose_tokens(h Wᵀ, …)` without top-k/top-p, the head applied block by block of W so the logits never
    leave the cache: for each block (DRAW_BLOCK entries) z = softcap·tanh(hWᵀ/softcap)/T, its
    maximum m_b and the masses Σ exp(z − m_b) of its SAMPLE_BLOCK-entry tiles (greedy: its best entry). Then

        lse = M + log Σ_b e^{m_b − M} mass_b,  M = max_b m_b;   the tile where u·Σ mass crosses, recomputed
        (SAMPLE_BLOCK × d per row), gives the token as `inverse_cdf` does, and log π = z_token − lse.

    Same tokens as `choose_tokens` on the full logits except where u lands within float rounding of a CDF
    boundary; log-probs equal up to float summation order. With `moments` (no softcap) it also gives `HeadMoments`:
    per block Σ e^{z−m_b} W_blk, rescaled by e^{m_b − M}, summed and divided by the total mass — one more product
    per run of kept tiles (a tile under MOMENT_FLOOR of every row's mass is left out) — is π W, and
    Σ π z = (π W)·h/T needs no pass of its own; returned third (else None).
    Without a softcap 1/T is applied to h (d numbers per row) rather than to the logits, and each block's
    exponentials are taken in place, so a block costs its products and four passes over its logits. `head.transposed`
    makes the moments' product Wᵀ_run e, the large operand read in its natural layout, where e W_run repacks W_run on
    every call (docs/cpu_choices.md); `head.packs` make each block's logits x W_blkᵀ through oneDNN's prepacked
    blocks (for up to `products.PREPACK_MAX_ROWS` rows). Either gives the same values up to float summation order.

    The products run in `head.weight`'s dtype: pass a bf16 copy of an fp32 head (`products.product_dtype`,
    `head_casts`) on a CPU with native bf16 products. x, W and each logit are then rounded to bf16 (relative 2⁻⁹):
    for logits up to ≈ 20 the policy stays within KL 2·10⁻³ of fp32's, a drawn token's log-prob within 0.1 nats of
    its fp32 value, E within 5 % and H within 0.1 nats (tests/test_models_sampling.py), and greedy picks the fp32
    argmax wherever the two best logits are 0.1 apart. Everything after the products (exp, sums, the CDF,
    log-probs) is fp32."""
    if moments and softcap:
        raise ValueError("draw_from_head(moments=True) needs a head without a final softcap")
    weight = head.weight
    t = floored_temperature(temperature)
    h = hidden.float()
    x = h if softcap else h / t
    xp = x.to(weight.dtype)  # the products' operand: fp32, or bf16 with a bf16 head

    def capped(z: torch.Tensor) -> torch.Tensor:  # x Wᵀ → z: with a softcap, 1/T comes after the tanh
        return torch.tanh(z / softcap) * (softcap / t) if softcap else z

    maxima, masses, best, exps = _stream_blocks(weight, xp, capped, greedy=greedy, keep_exps=moments, packs=head.packs)
    maxima = torch.cat(maxima)  # (blocks, rows)
    top = maxima.amax(0)
    scales = torch.exp(maxima - top)  # (blocks, rows)
    per_block = torch.tensor([m.shape[0] for m in masses])  # the last block may be shorter
    tiles = (torch.cat(masses) * scales.repeat_interleave(per_block, dim=0)).T  # (rows, V/512)
    cdf = tiles.cumsum(1)
    total = cdf[:, -1]
    lse = top + torch.log(total)
    found = None
    if moments:
        per_mass = scales / total  # (blocks, rows): e^{m_b − M} / Σ, which turns a block's e^{z − m_b} into π
        kept = (tiles >= MOMENT_FLOOR * total.unsqueeze(1)).any(0)  # tiles holding enough of some row's mass
        mean_row = _head_mean(weight, exps, per_mass, kept, weight_t=head.transposed)
        found = HeadMoments(mean_row, lse - (mean_row * h).sum(-1) / t)
    if greedy:  # the first block holding the largest logit, and its first entry there (argmax's tie rule)
        return torch.stack(best).gather(0, maxima.argmax(0, keepdim=True)).squeeze(0), top - lse, found
    token, z_token = _draw_in_tile(weight, xp, tiles=tiles, cdf=cdf, target=uniforms.to(cdf.dtype) * cdf[:, -1],
                                   top=top, capped=capped)
    return token, z_token - lse, found


def _stream_blocks(weight: torch.Tensor, xp: torch.Tensor, capped: Callable[[torch.Tensor], torch.Tensor], *,
                   greedy: bool, keep_exps: bool,
                   packs: list[torch.Tensor] | None = None) -> tuple[list[torch.Tensor], ...]:
    """`draw_from_head`'s pass over W, DRAW_BLOCK entries at a time: per block its maxima m_b (1, rows), tile masses
    Σ e^{z − m_b} (tiles, rows), greedy's best entry (rows,) and, with `keep_exps`, e^{z − m_b} (entries, rows) in
    W's dtype for the moments' product (`_head_mean`). With `packs` (`head_packs`) each block's product runs
    through its prepacked weight (its (rows, entries) result transposed once)."""
    rows, block = xp.shape[0], DRAW_BLOCK
    xt = xp.T.contiguous() if packs is None else None
    # vocabulary-major (entries × rows), as W_blk xᵀ comes out: every reduction runs over the leading dimension
    maxima, masses, best, exps = [], [], [], []
    for index, start in enumerate(range(0, weight.shape[0], block)):
        if packs is None:
            z = capped(torch.mm(weight[start : start + block], xt).float())
        else:
            z = capped(prepacked_linear(xp, packs[index]).T.to(torch.float32, memory_format=torch.contiguous_format))
        m = z.amax(0, keepdim=True)
        maxima.append(m)
        if greedy:
            best.append(z.argmax(0) + start)
        e = z.sub_(m).clamp_(min=EXP_FLOOR).exp_()  # z is not needed again
        masses.append(e.view(-1, SAMPLE_BLOCK, rows).sum(1))  # (tiles in the block, rows)
        if keep_exps:
            exps.append(e.to(weight.dtype))
    return maxima, masses, best, exps


def _head_mean(weight: torch.Tensor, exps: list[torch.Tensor], per_mass: torch.Tensor, kept: torch.Tensor, *,
               weight_t: torch.Tensor | None) -> torch.Tensor:
    """π W (rows, d) = Σ_b (e_b W_blk) · e^{m_b − M} / Σ from each block's e_b = e^{z − m_b} (`_stream_blocks`) and
    `per_mass` e^{m_b − M} / Σ (blocks, rows), the product taken only over the SAMPLE_BLOCK-entry tiles marked in
    `kept` (V / SAMPLE_BLOCK,): one product per run of consecutive kept tiles within a block.
    With `weight_t` (Wᵀ, contiguous (d, V)) the product is Wᵀ_run e_run: the large operand read in its natural
    layout, where e_runᵀ W_run would repack W_run on every call (docs/cpu_choices.md)."""
    mean_row = torch.zeros(per_mass.shape[1], weight.shape[1], device=weight.device)
    runs = _kept_runs(kept.tolist(), DRAW_BLOCK // SAMPLE_BLOCK)
    for first, last in runs:  # tile indices [first, last), all in one block
        index = first * SAMPLE_BLOCK // DRAW_BLOCK
        start, stop = first * SAMPLE_BLOCK, last * SAMPLE_BLOCK
        e = exps[index][start - index * DRAW_BLOCK : stop - index * DRAW_BLOCK]
        if weight_t is not None:
            rows_sum = torch.mm(weight_t[:, start:stop], e).float().T  # (rows, d)
        else:
            rows_sum = torch.mm(e.T, weight[start:stop]).float()
        mean_row += rows_sum * per_mass[index].unsqueeze(1)
    return mean_row


def _kept_runs(kept: list[bool], per_block: int) -> list[tuple[int, int]]:
    """The runs [first, last) of consecutive True entries of `kept`, split where a block of `per_block` entries ends."""
    runs: list[tuple[int, int]] = []
    for index, keep in enumerate(kept):
        if not keep:
            continue
        if runs and runs[-1][1] == index and index % per_block:
            runs[-1] = (runs[-1][0], index + 1)
        else:
            runs.append((index, index + 1))
    return runs


def _draw_in_tile(weight: torch.Tensor, xp: torch.Tensor, *, tiles: torch.Tensor, cdf: torch.Tensor,
                  target: torch.Tensor, top: torch.Tensor,
                  capped: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """`draw_from_head`'s last step: the tile where each row's target u·Σ mass falls in the tiles' CDF, its logits
    recomputed (SAMPLE_BLOCK × d per row, in the products' dtype) and searched as `inverse_cdf` does. Returns
    each row's token and its logit z."""
    tile = (cdf < target.unsqueeze(1)).sum(1).clamp(max=tiles.shape[1] - 1)
    before = (cdf.gather(1, tile.unsqueeze(1)) - tiles.gather(1, tile.unsqueeze(1))).squeeze(1)
    # each row's tile of W read in place (a view per row, no gathered copy of 512 × d rows)
    z_tile = capped(torch.stack([weight[s * SAMPLE_BLOCK : (s + 1) * SAMPLE_BLOCK] @ xp[r]
                                 for r, s in enumerate(tile.tolist())]).float())
    inside = torch.exp(z_tile - top.unsqueeze(1)).cumsum(1) + before.unsqueeze(1)
    offset = (inside < target.unsqueeze(1)).sum(1).clamp(max=SAMPLE_BLOCK - 1)
    return tile * SAMPLE_BLOCK + offset, z_tile.gather(1, offset.unsqueeze(1)).squeeze(1)

