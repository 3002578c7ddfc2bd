"""The sampler: prompts in, completions out (with what the update may reuse of the LM head).

Static shapes everywhere, so XLA compiles a handful of graphs once and then only runs them:
- prompts are left-padded to a multiple of `bucket` (a few buckets in all);
- the completion buffer is always `max_new_tokens` long; finished rows keep running, writing `<pad>`;
- one prefill forward fills a static KV cache of length P + N, then N − 1 single-token decode forwards
  read and write it at a device-side position (no `.item()`, no Python `if` on device values);
- Gemma runs through `decoder.forward`, a lean forward on the model's own modules (see there why).
On CPU/GPU (cheap host checks) the loop stops early when every row has finished, and the eager lean
sampler also drops finished rows from the batch, skips the left-padding columns that every prompt has and
attends to the cache slots written so far only; on XLA it never looks at device values. Prefill and decode
run inside the compile monitor's phases.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

import torch
from transformers import StaticCache

from . import decoder
from .decoder import position_ids_from_mask
from .device import (
    PREPACK_MAX_ROWS,
    compile_monitor,
    cpu_prepacked_products,
    host_syncs_are_cheap,
    mark_step,
    padded_rows,
    prepack_weight,
    prepacked_linear,
    product_dtype,
    shard_batch,
)
from .models import base_model


@dataclass
class Rollout:
    """A batch of sampled completions. B = prompts × group size; P = padded prompt length; N = max_new_tokens."""

    prompt_ids: torch.Tensor
    """(B, P) left-padded prompt tokens."""
    prompt_mask: torch.Tensor
    """(B, P) 1 on real prompt tokens."""
    completion_ids: torch.Tensor
    """(B, N) sampled tokens; `<pad>` after the stop token."""
    completion_mask: torch.Tensor
    """(B, N) 1 up to and including the stop token, 0 after it."""
    sampling_logprobs: torch.Tensor
    """(B, N) log-prob of each sampled token under the temperature-scaled policy at sampling time."""
    truncated: torch.Tensor
    """(B,) True where no stop token appeared within N tokens."""
    head_mean: torch.Tensor | None = None
    """(B, N, d) at each sampled position, the policy's expected LM-head row Σ_v π_v W_v under the temperature-scaled
    distribution over the whole vocabulary (0 after the stop token); only with `SamplerSettings(head_moments=True)`.
    With the sampled token's row W_y, (W_y − head_mean)/T is the gradient of log π(y) with respect to the final
    hidden state — what the update needs from the LM head (`logprobs.logprobs_from_head_mean`)."""
    entropy: torch.Tensor | None = None
    """(B, N) the entropy of that distribution (0 after the stop token); with `head_mean`."""

    def first_rows(self, rows: int) -> Rollout:
        """The first `rows` rows."""
        return Rollout(*(None if (x := getattr(self, f.name)) is None else x[:rows] for f in fields(self)))

    def rows(self, index: torch.Tensor) -> Rollout:
        """The rows at `index` (a 1-D tensor of row numbers), in that order."""
        return Rollout(*(None if (x := getattr(self, f.name)) is None else x[index.to(x.device)] for f in fields(self)))

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    def trimmed(self, multiple: int = 8) -> Rollout:
        """The same rollout without the all-padding tail of the completions (kept to a multiple of
        `multiple`): fewer positions for the log-prob and training forwards, the same masked losses. Reads
        the mask on the host, so only for cpu/cuda — XLA keeps the fixed width (one graph)."""
        width = min(self.completion_ids.shape[1], bucket_length(int(self.completion_mask.sum(1).max()), multiple))
        if width == self.completion_ids.shape[1]:
            return self
        return replace(self, completion_ids=self.completion_ids[:, :width],
                       completion_mask=self.completion_mask[:, :width],
                       sampling_logprobs=self.sampling_logprobs[:, :width],
                       head_mean=None if self.head_mean is None else self.head_mean[:, :width],
                       entropy=None if self.entropy is None else self.entropy[:, :width])

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    def decoded(self, tokenizer: Any) -> tuple[list[str], list[list[int]], torch.Tensor]:
        """Each completion's text (special tokens dropped), its token ids up to and including the stop token, and
        the (B,) lengths, on the host: what rewards and the RFT control read."""
        lengths = self.completion_mask.cpu().sum(1)
        comp = self.completion_ids.cpu()
        ids = [comp[i, : lengths[i]].tolist() for i in range(comp.shape[0])]
        return tokenizer.batch_decode(ids, skip_special_tokens=True), ids, lengths


def concat_rollouts(rolls: list[Rollout], pad_id: int) -> Rollout:
    """The rows of several rollouts as one, in order: prompts left-padded to the widest (pad id, mask 0), completions
    right-padded to the longest (pad id, mask 0, log-probs, moments and entropies 0) — the layout `sample` makes."""
    if len(rolls) == 1:
        return rolls[0]
    width = max(r.prompt_ids.shape[1] for r in rolls)
    length = max(r.completion_ids.shape[1] for r in rolls)

    def joined(name: str, *, left: bool, value: float) -> torch.Tensor | None:
        parts = [getattr(r, name) for r in rolls]
        if any(x is None for x in parts):
            return None
        if parts[0].dim() == 1:
            return torch.cat(parts)
        padded = []
        for x in parts:
            missing = (width if left else length) - x.shape[1]
            pad = [0, 0] * (x.dim() - 2) + ([missing, 0] if left else [0, missing])
            padded.append(torch.nn.functional.pad(x, pad, value=value))
        return torch.cat(padded)

    return Rollout(
        prompt_ids=joined("prompt_ids", left=True, value=pad_id), prompt_mask=joined("prompt_mask", left=True, value=0),
        completion_ids=joined("completion_ids", left=False, value=pad_id),
        completion_mask=joined("completion_mask", left=False, value=0),
        sampling_logprobs=joined("sampling_logprobs", left=False, value=0.0),
        truncated=joined("truncated", left=False, value=0), head_mean=joined("head_mean", left=False, value=0.0),
        entropy=joined("entropy", left=False, value=0.0))


COMPACT_BELOW = 0.75
"""Eager cpu/cuda rollouts drop finished rows from the batch once at most this share of it is still running
(each drop copies the KV cache of the rows kept, so not at every finished row)."""


def bucket_length(length: int, bucket: int) -> int:
    """Smallest multiple of `bucket` ≥ length."""
    return max(bucket, math.ceil(length / bucket) * bucket)


def render_prompt(tokenizer: Any, prompt: str | list) -> str:
    """A prompt as the model sees it: chat messages through the chat template (with the generation prompt); a
    string as it is."""
    return (
        prompt
        if isinstance(prompt, str)
        else tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    )


def prompt_tokens(tokenizer: Any, prompt: str | list) -> int:
    """How many tokens `prompt` takes once rendered."""
    return len(tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"])


def encode_prompts(
    tokenizer: Any, prompts: list, bucket: int = 32, max_length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Render prompts (chat messages or strings) with the chat template and left-pad them to a bucket.

    Returns (ids, mask) of shape (B, P) with P a multiple of `bucket`.
    """
    texts = [render_prompt(tokenizer, p) for p in prompts]
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    longest = max(len(e) for e in encoded)
    if max_length is not None and longest > max_length:
        i = max(range(len(encoded)), key=lambda k: len(encoded[k]))
        raise ValueError(f"prompt {i} has {longest} tokens, more than the limit {max_length}: {texts[i][:120]!r}")
    width = bucket_length(longest, bucket)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(encoded), width), pad, dtype=torch.long)
    mask = torch.zeros((len(encoded), width), dtype=torch.long)
    for row, e in enumerate(encoded):
        ids[row, width - len(e) :] = torch.tensor(e, dtype=torch.long)
        mask[row, width - len(e) :] = 1
    return ids, mask


class GroupPrompts:
    """A rollout's prompt batch, step after step: each prompt encoded (`encode_prompts`) and repeated for its group
    of `group_size` samples. On a device where a new shape means a new compiled program (XLA), widths only grow:
    a batch is left-padded to the widest seen so far, so shorter prompts reuse the programs of a wider batch."""

    def __init__(self, tokenizer: Any, *, bucket: int, group_size: int, device: torch.device,
                 max_length: int | None = None) -> None:
        self.tokenizer, self.bucket, self.group_size, self.max_length = tokenizer, bucket, group_size, max_length
        self.widths_only_grow = not host_syncs_are_cheap(device)
        self.width = 0
        """The widest prompt batch so far (used where widths only grow)."""

    def __call__(self, prompts: list) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, mask) of shape (len(prompts) × group_size, P), each prompt's rows together."""
        ids, mask = encode_prompts(self.tokenizer, prompts, self.bucket, max_length=self.max_length)
        if self.widths_only_grow:
            self.width = max(self.width, ids.shape[1])
            ids = torch.nn.functional.pad(ids, (self.width - ids.shape[1], 0), value=self.tokenizer.pad_token_id)
            mask = torch.nn.functional.pad(mask, (self.width - mask.shape[1], 0), value=0)
        return ids.repeat_interleave(self.group_size, 0), mask.repeat_interleave(self.group_size, 0)


def check_grouped(prompt_ids: torch.Tensor, group_size: int) -> None:
    """Raise unless the rows come in runs of `group_size` identical prompts (compared on the CPU only: elsewhere
    the check would wait for the device)."""
    if group_size > 1 and (prompt_ids.shape[0] % group_size or (prompt_ids.device.type == "cpu" and not torch.equal(
            prompt_ids[::group_size].repeat_interleave(group_size, 0), prompt_ids))):
        raise ValueError(f"group_size={group_size}: prompt rows must come in runs of {group_size} identical rows")


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


class SampledHead(NamedTuple):
    """What a rollout kept of the LM head at each of its completion tokens (B, N …), for the update to use in place
    of its own pass over the head (`logprobs.logprobs_from_head_mean`)."""

    logprobs: torch.Tensor
    """(B, N) `Rollout.sampling_logprobs`."""
    head_mean: torch.Tensor
    """(B, N, d) `Rollout.head_mean`."""
    entropy: torch.Tensor
    """(B, N) `Rollout.entropy`."""


@dataclass
class HeadInput:
    """A decode step's final hidden states (B, d) with the LM head still to apply: `_draw` streams the head
    through the draw (`draw_from_head`) when it can, and otherwise makes the logits."""

    hidden: torch.Tensor
    head: torch.nn.Module
    softcap: float | None
    weights: HeadWeights | None = None
    """The head's weight as `draw_from_head` multiplies it (in `RolloutSetup.product_dtype`, and its transpose where
    kept: `head_casts`); None = the head's own weight. Its prepacked blocks are added at the draw (`head_packs`)."""

    def logits(self) -> torch.Tensor:
        logits = decoder.lm_head_logits(self.head, self.hidden)
        return torch.tanh(logits / self.softcap) * self.softcap if self.softcap else logits

    def streams(self, settings: SamplerSettings) -> bool:
        """Plain sampling or greedy, with a plain large head on the CPU: what `draw_from_head` covers."""
        weight = getattr(self.head, "weight", None)
        return (type(self.head) is torch.nn.Linear and self.head.bias is None and self.hidden.device.type == "cpu"
                and weight.shape[0] >= 8 * decoder.LM_HEAD_BLOCK and weight.shape[0] % SAMPLE_BLOCK == 0
                and (settings.greedy or (not settings.top_k and settings.top_p >= 1.0)))


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
    for oneDNN (`device.prepack_weight`: as much memory again as that weight), or None where products stay plain.
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
    blocks (for up to `device.PREPACK_MAX_ROWS` rows). Either gives the same values up to float summation order.

    The products run in `head.weight`'s dtype: pass a bf16 copy of an fp32 head (`device.product_dtype`,
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


@dataclass(frozen=True)
class SamplerSettings:
    """How prompts are encoded and completions drawn (`sample`, `choose_tokens`; `sampler.Sampler` holds one). The
    temperature may be a one-element device tensor on XLA (a live control as a graph input); `Sampler.generate`
    takes the values a live control sets for one call."""

    max_new_tokens: int = 40
    """N, the completion tokens drawn per row (a row stops early at a stop token)."""
    temperature: float = 1.0
    """Softmax temperature T of the sampled tokens (ignored when `greedy`)."""
    top_k: int = 0
    """Sample among the k most likely tokens; 0 = all."""
    top_p: float = 1.0
    """Nucleus sampling: the smallest set of tokens holding this much probability; 1 = all."""
    greedy: bool = False
    """The most likely token at every step (evaluation), no noise drawn."""
    prompt_bucket: int = 32
    """Prompts are left-padded to a multiple of this many tokens (fewer shapes to compile)."""
    max_prompt_tokens: int | None = None
    """A prompt longer than this is refused with a message naming it; None = no limit."""
    compiled: bool | None = None
    """`torch.compile` the decode step (cpu/cuda). `Sampler` reads None as where it runs (CUDA with Triton:
    `device.compile_supported`); `sample` as off."""
    lean: bool | None = None
    """The kit's lean Gemma forward (`decoder.py`); None = where `decoder.supports` the model, False = HF's forward."""
    head_moments: bool = False
    """Keep, per sampled token, the LM head's expected row and the entropy (`Rollout.head_mean`, `.entropy`), which
    the update can use in place of its own pass over the head."""
    product_dtype: torch.dtype | None = None
    """The eager sampler's weight products; None = `device.product_dtype` (bf16 where a CPU multiplies it natively)."""
    padding_free: bool = False
    """Log-probs through the packed padding-free forward (Gemma on cpu/cuda: real tokens only)."""
    share_prompt_forward: bool = True
    """Log-probs run each group's prompt once (rows come in groups of `group_size`)."""


@dataclass
class RolloutSetup:
    """What one rollout runs on and keeps fixed while it runs: the model, its prepared prompts (B rows, P positions),
    the stop and pad tokens, how tokens are drawn and the noise drawn for them."""

    model: torch.nn.Module
    hf: torch.nn.Module
    """The causal LM under any peft wrapper (`models.base_model`)."""
    ids: torch.Tensor
    """(B, P) left-padded prompt tokens on the model's device."""
    mask: torch.Tensor
    """(B, P) 1 on real prompt tokens."""
    max_new_tokens: int
    stop: torch.Tensor
    """The stop token ids."""
    pad: torch.Tensor
    """(B,) `<pad>`, written after a row's stop token."""
    settings: SamplerSettings
    group_size: int
    uniforms: torch.Tensor | None
    """(B, N) one U(0, 1) per row and step (None when greedy)."""
    can_peek: bool
    """Host reads of device values are cheap (cpu/cuda): the loop may stop once every row has finished."""
    moments_of: torch.Tensor | None = None
    """The LM head's weight W when `HeadMoments` are kept for every sampled token (else None)."""
    product_dtype: torch.dtype | None = None
    """The dtype the eager sampler multiplies its weights in — the layers' projections and the LM head
    (`draw_from_head`); None = `device.product_dtype` (bf16 for an fp32 model on a CPU with native bf16 products)."""

    @property
    def length(self) -> int:
        return self.ids.shape[1]

    @property
    def positions(self) -> torch.Tensor:
        return position_ids_from_mask(self.mask)

    @property
    def full_mask(self) -> torch.Tensor:
        """(B, P + N) the key mask of the whole rollout: the prompt's, then every completion slot."""
        ones = torch.ones(self.ids.shape[0], self.max_new_tokens, dtype=self.mask.dtype, device=self.ids.device)
        return torch.cat([self.mask, ones], 1)

    @property
    def shapes(self) -> dict[str, int]:
        return {"batch": self.ids.shape[0], "prompt_len": self.length, "max_new_tokens": self.max_new_tokens}


@dataclass
class SamplerState:
    """A rollout in progress, carried from one decode step to the next. B' = the rows still in the batch (B
    unless finished rows have left it)."""

    cache: Any
    """`decoder.KVCache` or HF's `StaticCache`, P + N slots."""
    token: torch.Tensor
    """(B',) the token just drawn."""
    logprob: torch.Tensor
    """(B',) its log-prob under the temperature-scaled policy."""
    uniforms: torch.Tensor | None
    """(B', N) the rows' random numbers."""
    step_index: torch.Tensor
    """(1,) the decode step, on the device: picks the uniforms' column without baking it into the graph."""
    next_pos: torch.Tensor
    """(B', 1) position id of the token just drawn."""
    cache_pos: torch.Tensor
    """(1,) the cache slot it goes into."""
    alive: torch.Tensor
    """(B',) no stop token drawn before this one."""
    rows: torch.Tensor
    """(B',) which of the B rows these are."""
    written: torch.Tensor | None = None
    """(B',) what goes into the completion (`<pad>` on finished rows) and is fed to the next step."""
    moments: HeadMoments | None = None
    """The head moments of the token just drawn (`RolloutSetup.moments_of`)."""
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    """Per step (rows, tokens, log-probs, alive, moments), stacked once at the end: writing into a buffer at a
    Python index t would bake t into the graph and compile one graph per token on XLA."""

    def keep(self, keep: torch.Tensor) -> None:
        """Only the rows at `keep` go on decoding (each drop copies their KV cache)."""
        self.rows, self.alive, self.written, self.next_pos = (self.rows[keep], self.alive[keep], self.written[keep],
                                                              self.next_pos[keep])
        self.cache = self.cache.select_rows(keep)
        if self.uniforms is not None:
            self.uniforms = self.uniforms[keep]


def _draw(logits: torch.Tensor | HeadInput, *, uniforms: torch.Tensor | None, step_index: torch.Tensor,
          settings: SamplerSettings,
          moments_of: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, HeadMoments | None]:
    """One token per row from `logits`, with the uniforms' column `step_index` (picked on the device); with
    `moments_of` (the head's weight) also the `HeadMoments` of the full temperature-scaled distribution."""
    u = uniforms.index_select(1, step_index).squeeze(1) if uniforms is not None else None
    if isinstance(logits, HeadInput):
        if (u is not None or settings.greedy) and logits.streams(settings):
            weights = logits.weights or HeadWeights(logits.head.weight)
            # a decode step's few rows go through the head's blocks prepacked (kept while the head is unchanged)
            few_rows = logits.hidden.shape[0] <= PREPACK_MAX_ROWS
            head = weights._replace(packs=head_packs(weights.weight) if few_rows else None)
            return draw_from_head(logits.hidden, head, temperature=settings.temperature, softcap=logits.softcap,
                                  greedy=settings.greedy, uniforms=u, moments=moments_of is not None)
        logits = logits.logits()
    token, logprob = choose_tokens(logits, settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                                   greedy=settings.greedy, uniforms=u)
    return token, logprob, None if moments_of is None else head_moments(logits, moments_of, settings.temperature)


def _start(setup: RolloutSetup, cache: Any, logits: torch.Tensor) -> SamplerState:
    """The state after the prefill: its logits give the first token. Every tensor the decode steps carry is made
    before the prefill's `mark_step`, so on XLA the first decode step is the same graph as the others."""
    device, batch = setup.ids.device, setup.ids.shape[0]
    step_index = torch.zeros(1, dtype=torch.long, device=device)
    next_pos, cache_pos = setup.positions[:, -1:] + 1, torch.tensor([setup.length], device=device)
    # made on the CPU and split like the batch: the decode steps then see the same layout
    alive = shard_batch(torch.ones(batch, dtype=torch.bool).to(device))
    rows = torch.arange(batch, device=device)
    token, logprob, moments = _draw(logits, uniforms=setup.uniforms, step_index=step_index, settings=setup.settings,
                                    moments_of=setup.moments_of)
    mark_step(device)
    return SamplerState(cache=cache, token=token, logprob=logprob, uniforms=setup.uniforms, step_index=step_index,
                        next_pos=next_pos, cache_pos=cache_pos, alive=alive, rows=rows, moments=moments)


def _prefill_lean(setup: RolloutSetup, consts: decoder.Constants, visible: int | None, *,
                  share_prefix: bool = False) -> SamplerState:
    """Gemma's prefill through `decoder.forward`: each group's prompt once, its cache then repeated G times, or
    with `share_prefix` kept once per group for the decode steps to read (`decoder.KVCache.share_prefix`)."""
    hf, group = setup.hf, setup.group_size
    first, full_mask = slice(None, None, group), setup.full_mask
    cache = decoder.KVCache.empty(hf, setup.ids.shape[0] // group, full_mask.shape[1], full_mask[first])
    start = torch.zeros(1, dtype=torch.long, device=setup.ids.device)
    logits = decoder.forward(hf, setup.ids[first], setup.positions[first], cache, start, consts=consts, visible=visible)
    if group > 1:
        logits = logits.repeat_interleave(group, 0)
        share = share_prefix and decoder.shares_prefix(hf, full_mask.shape[1])
        cache = cache.share_prefix(group, setup.length) if share else cache.repeat_interleave(group, full_mask)
    return _start(setup, cache, logits)


def _record(state: SamplerState, setup: RolloutSetup) -> None:
    """Keep the token just drawn (`<pad>` on finished rows); a stop token ends its row after this step."""
    state.written = torch.where(state.alive, state.token, setup.pad[: len(state.rows)])
    moments = None
    if state.moments is not None:  # zero after the stop token, as the log-probs are
        moments = HeadMoments(torch.where(state.alive.unsqueeze(1), state.moments.mean_row, 0.0),
                              torch.where(state.alive, state.moments.entropy, 0.0))
    state.steps.append(
        (state.rows, state.written, torch.where(state.alive, state.logprob, torch.zeros_like(state.logprob)),
         state.alive, moments)
    )
    state.alive = state.alive & ~(state.token.unsqueeze(-1) == setup.stop).any(-1)  # torch.isin has no XLA lowering


def _decode(state: SamplerState, setup: RolloutSetup, step_logits: Callable[[SamplerState, int], torch.Tensor], *,
            drop_finished: bool) -> None:
    """The decode loop: N − 1 single-token forwards (`step_logits(state, t)`), each followed by a draw. Where host
    reads are cheap it stops once every row has finished and, with `drop_finished`, drops finished rows from the
    batch once at most COMPACT_BELOW of it is still running."""
    steps = setup.max_new_tokens
    for t in range(steps):
        _record(state, setup)
        if t == steps - 1:
            break
        if setup.can_peek:
            running = int(state.alive.sum())
            if running == 0:
                break
            if drop_finished and running <= COMPACT_BELOW * len(state.rows):
                state.keep(state.alive.nonzero().squeeze(1))
        logits = step_logits(state, t)
        state.step_index = state.step_index + 1
        state.token, state.logprob, state.moments = _draw(logits, uniforms=state.uniforms, step_index=state.step_index,
                                                          settings=setup.settings, moments_of=setup.moments_of)
        state.next_pos = state.next_pos + 1
        state.cache_pos = state.cache_pos + 1
        mark_step(setup.ids.device)


def _completions(state: SamplerState, setup: RolloutSetup) -> dict[str, torch.Tensor]:
    """The steps stacked into (B, N) completions; rows that left the batch early are scattered back."""
    batch, device = setup.ids.shape[0], setup.ids.device
    rows, tokens, logprobs, alive, moments = (list(x) for x in zip(*state.steps, strict=True))
    kept = {}
    if moments[0] is not None:
        kept = {"head_mean": [m.mean_row for m in moments], "entropy": [m.entropy for m in moments]}
    if any(r.shape[0] != batch for r in rows):
        def scatter(fill: torch.Tensor, values: list[torch.Tensor]) -> list[torch.Tensor]:
            return [fill.index_copy(0, r, x) for r, x in zip(rows, values, strict=True)]

        tokens = scatter(setup.pad, tokens)
        logprobs = scatter(torch.zeros_like(setup.pad, dtype=logprobs[0].dtype), logprobs)
        alive = scatter(torch.zeros_like(setup.pad, dtype=torch.bool), alive)
        kept = {k: scatter(v[0].new_zeros(batch, *v[0].shape[1:]), v) for k, v in kept.items()}
    missing = setup.max_new_tokens - len(tokens)  # cpu/cuda stopped early: every row had finished
    truncated = state.alive
    if state.rows.shape[0] != batch:
        truncated = torch.zeros(batch, dtype=torch.bool, device=device).index_copy(0, state.rows, state.alive)
    result = {"completion_ids": torch.stack(tokens + [setup.pad] * missing, dim=1),
              "sampling_logprobs": torch.stack(logprobs + [torch.zeros_like(logprobs[0])] * missing, dim=1),
              "completion_mask": torch.stack(alive + [torch.zeros_like(alive[0])] * missing, dim=1).long(),
              "truncated": truncated,
              **{k: torch.stack(v + [torch.zeros_like(v[0])] * missing, dim=1) for k, v in kept.items()}}
    mark_step(device)
    return result


def sample_eager(setup: RolloutSetup) -> dict[str, torch.Tensor]:
    """Gemma on cpu/cuda, eager: the left-padding columns every prompt has are dropped, attention reads the cache
    slots written so far only — on the CPU each group's prompt slots once for the whole group (a decode step there
    is bound by reading memory, and a long prompt is most of each row's keys and values) —, finished rows
    leave the batch, and the loop ends when every row has finished."""
    first = int(setup.mask.any(0).int().argmax())
    setup = replace(setup, ids=setup.ids[:, first:], mask=setup.mask[:, first:])
    plen, monitor, hf = setup.length, compile_monitor(), setup.hf
    dtype = setup.product_dtype or product_dtype(hf.model.embed_tokens.weight)
    with monitor.phase("prefill", **setup.shapes):
        consts = decoder.Constants.build(hf, plen + setup.max_new_tokens, product_dtype=dtype, prepack=True)
        state = _prefill_lean(setup, consts, visible=plen, share_prefix=setup.ids.device.type == "cpu")
    with monitor.phase("decode", **setup.shapes):
        softcap = decoder.final_softcap(hf)
        head = hf.lm_head.weight
        # Wᵀ for the moments' product where it is bf16 on the CPU: there each bf16 product repacks its right operand
        # (fp32's does not, and an fp32 Wᵀ would cost as much memory as the head)
        transposed = setup.moments_of is not None and head.device.type == "cpu" and dtype == torch.bfloat16
        cast, cast_t = head_casts(head, dtype, transposed=transposed)
        weights = HeadWeights(head if cast is None else cast, cast_t)
        _decode(state, setup, lambda s, t: HeadInput(
            decoder.forward(hf, s.written.unsqueeze(1), s.next_pos, s.cache, s.cache_pos, consts=consts,
                            visible=plen + t + 1, output="last_hidden"), hf.lm_head, softcap, weights),
                drop_finished=True)
        return _completions(state, setup)


def sample_fixed(setup: RolloutSetup, *, compiled: bool = False) -> dict[str, torch.Tensor]:
    """Gemma at one shape throughout: on XLA (a prefill graph and one decode graph, no reads of device values),
    or under `torch.compile` on cpu/cuda (`compiled`). Finished rows go on decoding, writing `<pad>`."""
    forward = decoder.compiled_forward() if compiled and setup.can_peek else decoder.forward
    monitor = compile_monitor()
    with monitor.phase("prefill", **setup.shapes):
        consts = decoder.Constants.build(setup.hf, setup.length + setup.max_new_tokens)
        state = _prefill_lean(setup, consts, visible=setup.length if setup.can_peek else None)
    with monitor.phase("decode", **setup.shapes):
        _decode(state, setup, lambda s, t: forward(setup.hf, s.written.unsqueeze(1), s.next_pos, s.cache, s.cache_pos,
                                                     consts=consts, visible=None), drop_finished=False)
        return _completions(state, setup)


def sample_hf(setup: RolloutSetup) -> dict[str, torch.Tensor]:
    """Any causal LM through HF's own forward with a `StaticCache` (every row prefilled, no lean decoder)."""
    full_mask, device, monitor = setup.full_mask, setup.ids.device, compile_monitor()
    with monitor.phase("prefill", **setup.shapes):
        cache = StaticCache(config=setup.hf.config, max_cache_len=full_mask.shape[1])
        logits = setup.model(input_ids=setup.ids, attention_mask=full_mask, position_ids=setup.positions,
                               past_key_values=cache, cache_position=torch.arange(setup.length, device=device),
                               use_cache=True, logits_to_keep=1).logits[:, -1, :]
        state = _start(setup, cache, logits)

    def step_logits(s: SamplerState, t: int) -> torch.Tensor:
        return setup.model(input_ids=s.written.unsqueeze(1), attention_mask=full_mask, position_ids=s.next_pos,
                             past_key_values=s.cache, cache_position=s.cache_pos, use_cache=True).logits[:, -1, :]

    with monitor.phase("decode", **setup.shapes):
        _decode(state, setup, step_logits, drop_finished=False)
        return _completions(state, setup)


def _uniforms(rows: int, steps: int, *, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """(rows, steps) U(0, 1), drawn on the generator's device (the CPU by default) and sent over once."""
    uniforms = torch.rand(
        (rows, steps), generator=generator, device=generator.device if generator is not None else device
    )
    return shard_batch(uniforms.to(device))


def _moments_weight(hf: torch.nn.Module) -> torch.Tensor:
    """The LM head's weight, for `HeadMoments`: refused for a head with a final softcap (∂z/∂h is then not W)."""
    if decoder.final_softcap(hf):
        raise ValueError("SamplerSettings(head_moments=True) needs an LM head without a final softcap "
                         f"({type(hf).__name__} has final_logit_softcapping={hf.config.final_logit_softcapping})")
    return hf.get_output_embeddings().weight


@torch.no_grad()
def sample(model: torch.nn.Module, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, settings: SamplerSettings, *,
           stop_ids: list[int], pad_id: int, generator: torch.Generator | None = None,
           group_size: int = 1) -> Rollout:
    """Generate `settings.max_new_tokens` for every row with a static KV cache; everything after a stop token is
    masked and set to `pad_id`. The prompts are (B, P) left-padded; the model's device is used throughout.

    Picks the execution mode: Gemma 2/3 models run through `decoder.forward` (a lean forward on the model's own
    modules) — `sample_eager` on cpu/cuda, `sample_fixed` on XLA or with `settings.compiled` (`torch.compile` on
    cpu/cuda) — others through HF's forward (`sample_hf`). `settings.lean` None = the lean forward when
    `decoder.supports` the model; False forces HF's. `group_size` G > 1 says rows come in groups of G copies of
    one prompt (as the trainer lays them out): the lean prefill then runs each prompt once. `settings.head_moments`
    keeps, for every sampled token, the policy's expected LM-head row and entropy (`Rollout.head_mean`,
    `.entropy`): one more product with the head per token (streamed with the draw on the CPU), which the update can
    use in place of its own pass over the head. The model's LM head must have no final softcap.
    `settings.product_dtype`: the eager sampler's weight products (projections, LM head); None =
    `device.product_dtype`, the model's dtype = exact. The prompt settings (bucket, length limit, the log-prob
    forward's) are `sampler.Sampler`'s and unused here.
    """
    device = next(model.parameters()).device
    rows_given, rows_split = prompt_ids.shape[0], padded_rows(prompt_ids.shape[0], device)
    if rows_split != rows_given:
        # SPMD splits the batch over every device: a few prompts (a chat cell, an eval tail) are padded with
        # copies of the last one, sampled, and the copies dropped
        if group_size > 1:
            raise ValueError(f"{rows_given} rows in groups of {group_size} cannot be split over the SPMD mesh: "
                             f"make prompts × group_size a multiple of {padded_rows(1, device)}")
        repeat = torch.cat([torch.arange(rows_given), torch.full((rows_split - rows_given,), rows_given - 1)])
        return sample(model, prompt_ids[repeat], prompt_mask[repeat], settings, stop_ids=stop_ids, pad_id=pad_id,
                      generator=generator).first_rows(rows_given)
    check_grouped(prompt_ids, group_size)
    hf = base_model(model)
    ids, mask = shard_batch(prompt_ids.to(device)), shard_batch(prompt_mask.to(device))
    n = settings.max_new_tokens
    uniforms = None if settings.greedy else _uniforms(ids.shape[0], n, generator=generator, device=device)
    setup = RolloutSetup(
        model=model, hf=hf, ids=ids, mask=mask, max_new_tokens=n, stop=torch.tensor(stop_ids, device=device),
        pad=shard_batch(torch.full((ids.shape[0],), pad_id).to(device)),  # made on the CPU: no graph to compile
        settings=settings, group_size=group_size, uniforms=uniforms, can_peek=host_syncs_are_cheap(device),
        moments_of=_moments_weight(hf) if settings.head_moments else None, product_dtype=settings.product_dtype,
    )
    compiled = bool(settings.compiled)
    was_training = model.training
    model.eval()
    try:
        if not (decoder.supports(hf) if settings.lean is None else settings.lean):
            completions = sample_hf(setup)
        elif setup.can_peek and not compiled:
            completions = sample_eager(setup)
        else:
            completions = sample_fixed(setup, compiled=compiled)
    finally:
        model.train(was_training)
    return Rollout(prompt_ids=ids, prompt_mask=mask, **completions)
