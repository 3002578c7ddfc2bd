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
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

import torch
from transformers import StaticCache

from ..data.chat import decode_completions
from . import decoder
from .choice import SAMPLE_BLOCK, HeadMoments, choose_tokens, head_moments
from .cpu.products import PREPACK_MAX_ROWS, product_dtype
from .cpu.streamed_head import HeadWeights, draw_from_head, head_casts, head_packs
from .decoder import position_ids_from_mask
from .device import compile_monitor, host_syncs_are_cheap, mark_step, padded_rows, shard_batch
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

    def to(self, device: torch.device) -> Rollout:
        """The same rollout on `device`."""
        return Rollout(*(None if (x := getattr(self, f.name)) is None else x.to(device) for f in fields(self)))

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
        return decode_completions(tokenizer, ids), ids, lengths


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
    """The eager sampler's weight products; None = `products.product_dtype` (bf16 where a CPU multiplies them
    natively)."""
    padding_free: bool = False
    """Log-probs through the packed padding-free forward (Gemma on cpu/cuda: real tokens only)."""
    share_prompt_forward: bool = True
    """Log-probs run each group's prompt once (rows come in groups of `group_size`)."""
    noise_block: tuple[int, int] = (0, 1)
    """(index, count): the rows given are block `index` of `count` equal blocks of a batch that several processes
    sample (`distributed.World`); each draws the whole batch's sampling noise and keeps its block's, so the rows
    sample what one process would."""


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
    (`draw_from_head`); None = `products.product_dtype` (bf16 for an fp32 model on a CPU with native bf16 products)."""

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


_TOLD_HF_FORWARD: set[str] = set()


def _say_hf_forward_once(hf: torch.nn.Module) -> None:
    """Warn, once per model class and process, that its rollouts run through HF's forward (several times slower than
    the lean one: `decoder.supports`)."""
    layers = getattr(getattr(hf, "model", None), "layers", None)
    kind = type(layers[0]).__name__ if layers else type(hf).__name__
    if kind not in _TOLD_HF_FORWARD:
        _TOLD_HF_FORWARD.add(kind)
        warnings.warn(f"{kind}: the kit's lean forward covers Gemma 2, 3 and 4 text layers without mixture-of-experts "
                      "blocks only, so this model samples through transformers' own forward (the same tokens, several "
                      "times slower)", stacklevel=3)


def _uniforms(rows: int, steps: int, *, generator: torch.Generator | None, device: torch.device,
              block: tuple[int, int] = (0, 1)) -> torch.Tensor:
    """(rows, steps) U(0, 1), drawn on the generator's device (the CPU by default) and sent over once. `block`
    (index, count): draw count × rows rows' and keep block `index`, what one process drawing for all of them gives
    these rows."""
    index, count = block
    uniforms = torch.rand(
        (rows * count, steps), generator=generator, device=generator.device if generator is not None else device
    )[index * rows:(index + 1) * rows]
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

    Picks the execution mode: Gemma 2/3/4 models run through `decoder.forward` (a lean forward on the model's own
    modules) — `sample_eager` on cpu/cuda, `sample_fixed` on XLA or with `settings.compiled` (`torch.compile` on
    cpu/cuda) — others through HF's forward (`sample_hf`). `settings.lean` None = the lean forward when
    `decoder.supports` the model; False forces HF's. `group_size` G > 1 says rows come in groups of G copies of
    one prompt (as the trainer lays them out): the lean prefill then runs each prompt once. `settings.head_moments`
    keeps, for every sampled token, the policy's expected LM-head row and entropy (`Rollout.head_mean`,
    `.entropy`): one more product with the head per token (streamed with the draw on the CPU), which the update can
    use in place of its own pass over the head. The model's LM head must have no final softcap.
    `settings.product_dtype`: the eager sampler's weight products (projections, LM head); None =
    `products.product_dtype`, the model's dtype = exact. The prompt settings (bucket, length limit, the log-prob
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
    uniforms = None if settings.greedy else _uniforms(ids.shape[0], n, generator=generator, device=device,
                                                      block=settings.noise_block)
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
            if settings.lean is None:
                _say_hf_forward_once(hf)
            completions = sample_hf(setup)
        elif setup.can_peek and not compiled:
            completions = sample_eager(setup)
        else:
            completions = sample_fixed(setup, compiled=compiled)
    finally:
        model.train(was_training)
    return Rollout(prompt_ids=ids, prompt_mask=mask, **completions)
