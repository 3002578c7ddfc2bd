"""The fixed-shape sampler and the log-prob forward.

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
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from transformers import DynamicCache, StaticCache

from . import decoder
from .decoder import position_ids_from_mask
from .device import compile_monitor, host_syncs_are_cheap, mark_step, padded_rows, shard_batch
from .losses import token_logprobs_and_entropy
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

    def head(self, rows: int) -> Rollout:
        """The first `rows` rows."""
        return Rollout(*(getattr(self, f.name)[:rows] for f in fields(self)))

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
                       completion_mask=self.completion_mask[:, :width], sampling_logprobs=self.sampling_logprobs[:, :width])

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)


COMPACT_BELOW = 0.75
"""Eager cpu/cuda rollouts drop finished rows from the batch once at most this share of it is still running
(each drop copies the KV cache of the rows kept, so not at every finished row)."""


def bucket_length(length: int, bucket: int) -> int:
    """Smallest multiple of `bucket` ≥ length."""
    return max(bucket, math.ceil(length / bucket) * bucket)


def encode_prompts(tokenizer: Any, prompts: list, bucket: int = 32, max_length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Render prompts (chat messages or strings) with the chat template and left-pad them to a bucket.

    Returns (ids, mask) of shape (B, P) with P a multiple of `bucket`.
    """
    texts = [
        p if isinstance(p, str) else tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]
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


def check_grouped(prompt_ids: torch.Tensor, group_size: int) -> None:
    """Raise unless the rows come in runs of `group_size` identical prompts (compared on the CPU only: elsewhere
    the check would wait for the device)."""
    if group_size > 1 and (prompt_ids.shape[0] % group_size or (prompt_ids.device.type == "cpu" and not torch.equal(
            prompt_ids[::group_size].repeat_interleave(group_size, 0), prompt_ids))):
        raise ValueError(f"group_size={group_size}: prompt rows must come in runs of {group_size} identical rows")


SAMPLE_BLOCK = 512
"""Tokens per block of the two-level inverse-CDF search (`inverse_cdf`)."""


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
    tiles = torch.nn.functional.pad(flat, (0, blocks * width - vocab)).view(rows, blocks, width)
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
    scaled = logits / (temperature.clamp(min=1e-5) if isinstance(temperature, torch.Tensor) else max(temperature, 1e-5))
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
            tokens = torch.where(torch.isinf(filtered.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)), filtered.argmax(-1), tokens)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def sample(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    generator: torch.Generator | None = None,
    group_size: int = 1,
    lean: bool | None = None,
    compiled: bool = False,
) -> Rollout:
    """Generate `max_new_tokens` for every row with a static KV cache; everything after a stop token is
    masked and set to `pad_id`. Prompts are (B, P) left-padded; the model's device is used throughout.

    Gemma 2/3 models run through `decoder.forward` (a lean forward on the model's own modules), others
    through HF's forward with a `StaticCache`. `group_size` G > 1 says rows come in groups of G copies of
    one prompt (as the trainer lays them out): the prompt is then prefilled once and its cache repeated.
    `lean` None = the lean forward when `decoder.supports` the model; False forces HF's forward. `compiled`
    runs the lean decode steps under `torch.compile` on cpu/cuda (XLA compiles its graphs anyway).
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
        roll = sample(model, prompt_ids[repeat], prompt_mask[repeat], max_new_tokens, stop_ids, pad_id, temperature, top_k,
                      top_p, greedy, generator, group_size, lean, compiled)
        return roll.head(rows_given)
    can_peek = host_syncs_are_cheap(device)
    monitor = compile_monitor()
    was_training = model.training
    model.eval()
    check_grouped(prompt_ids, group_size)
    prompt_ids, prompt_mask = shard_batch(prompt_ids.to(device)), shard_batch(prompt_mask.to(device))
    given_ids, given_mask = prompt_ids, prompt_mask
    hf = base_model(model)
    lean = decoder.supports(hf) if lean is None else lean
    # eager lean cpu/cuda: finished rows leave the batch, attention reads the slots written so far only, and
    # the left-padding columns that every prompt has are dropped (they would only be masked out)
    compact = lean and can_peek and not compiled
    if compact:
        first = int(prompt_mask.any(0).int().argmax())
        prompt_ids, prompt_mask = prompt_ids[:, first:], prompt_mask[:, first:]
    batch, plen = prompt_ids.shape
    total = plen + max_new_tokens
    shapes = {"batch": batch, "prompt_len": plen, "max_new_tokens": max_new_tokens}
    lean_forward = decoder.compiled_forward() if lean and compiled and can_peek else decoder.forward
    full_mask = torch.cat([prompt_mask, torch.ones(batch, max_new_tokens, dtype=prompt_mask.dtype, device=device)], 1)
    positions = position_ids_from_mask(prompt_mask)
    stop = torch.tensor(stop_ids, device=device)

    # One uniform per row and step, drawn up front (on the generator's device, the CPU by default) and sent
    # over once; column t is picked with a device-side index so every decode step is the same graph.
    uniforms = None
    if not greedy:
        uniforms = torch.rand((batch, max_new_tokens), generator=generator,
                              device=generator.device if generator is not None else device)
        uniforms = shard_batch(uniforms.to(device))
    step_index = torch.zeros(1, dtype=torch.long, device=device)

    def draw(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        u = uniforms.index_select(1, step_index).squeeze(1) if uniforms is not None else None
        return choose_tokens(logits, temperature, top_k, top_p, greedy, u)

    with monitor.phase("prefill", **shapes):
        if lean:
            first = slice(None, None, group_size)
            consts = decoder.Constants.build(hf, total)
            cache = decoder.KVCache.empty(hf, batch // group_size, total, full_mask[first])
            logits = decoder.forward(hf, prompt_ids[first], positions[first], cache, torch.zeros_like(step_index), consts,
                                     visible=plen if can_peek else None)
            if group_size > 1:
                cache, logits = cache.repeat_interleave(group_size, full_mask), logits.repeat_interleave(group_size, 0)
        else:
            cache = StaticCache(config=hf.config, max_cache_len=total)
            logits = model(
                input_ids=prompt_ids, attention_mask=full_mask, position_ids=positions, past_key_values=cache,
                cache_position=torch.arange(plen, device=device), use_cache=True, logits_to_keep=1,
            ).logits[:, -1, :]
        token, logprob = draw(logits)
        mark_step(device)
    # Per-step results are kept in lists and stacked once at the end: writing into a buffer at a Python
    # index t would bake t into the graph and compile one graph per token on XLA.
    step_tokens, step_logprobs, step_alive, step_rows = [], [], [], []
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    pad = torch.full_like(token, pad_id)
    next_pos = positions[:, -1:] + 1
    cache_pos = torch.tensor([plen], device=device)
    rows = torch.arange(batch, device=device)  # the batch rows still decoding (fewer once rows leave)
    with monitor.phase("decode", **shapes):
        for t in range(max_new_tokens):
            written = torch.where(alive, token, pad[: len(rows)])
            step_rows.append(rows)
            step_tokens.append(written)
            step_logprobs.append(torch.where(alive, logprob, torch.zeros_like(logprob)))
            step_alive.append(alive)
            alive = alive & ~(token.unsqueeze(-1) == stop).any(-1)  # torch.isin has no XLA lowering (CPU fallback, host sync)
            if t == max_new_tokens - 1:
                break
            if can_peek:
                running = int(alive.sum())
                if running == 0:
                    break
                if compact and running <= COMPACT_BELOW * len(rows):
                    keep = alive.nonzero().squeeze(1)
                    rows, alive, written, next_pos = rows[keep], alive[keep], written[keep], next_pos[keep]
                    cache = cache.select_rows(keep)
                    if uniforms is not None:
                        uniforms = uniforms[keep]
            if lean:
                # eager cpu/cuda attend to the slots written so far only; XLA and compiled keep one shape
                visible = plen + t + 1 if compact else None
                logits = lean_forward(hf, written.unsqueeze(1), next_pos, cache, cache_pos, consts, visible=visible)
            else:
                logits = model(
                    input_ids=written.unsqueeze(1), attention_mask=full_mask, position_ids=next_pos, past_key_values=cache,
                    cache_position=cache_pos, use_cache=True,
                ).logits[:, -1, :]
            step_index = step_index + 1
            token, logprob = draw(logits)
            next_pos = next_pos + 1
            cache_pos = cache_pos + 1
            mark_step(device)
        missing = max_new_tokens - len(step_tokens)  # CPU/GPU early stop: every row already finished
        if compact:  # scatter the steps decoded on fewer rows back to the whole batch
            def scatter(fill: torch.Tensor, values: list[torch.Tensor]) -> list[torch.Tensor]:
                return [fill.index_copy(0, r, x) for r, x in zip(step_rows, values, strict=True)]

            step_tokens = scatter(pad, step_tokens)
            step_logprobs = scatter(torch.zeros_like(pad, dtype=logprob.dtype), step_logprobs)
            step_alive = scatter(torch.zeros_like(pad, dtype=torch.bool), step_alive)
        tokens = torch.stack(step_tokens + [pad] * missing, dim=1)
        logprobs = torch.stack(step_logprobs + [torch.zeros_like(step_logprobs[0])] * missing, dim=1)
        mask = torch.stack(step_alive + [torch.zeros_like(step_alive[0])] * missing, dim=1).long()
        truncated = torch.zeros(batch, dtype=torch.bool, device=device).index_copy(0, rows, alive) if compact else alive
        mark_step(device)
    if was_training:
        model.train()
    return Rollout(given_ids, given_mask, tokens, mask, logprobs, truncated)


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    temperature: float = 1.0,
    chunk_rows: int | None = None,
    group_size: int = 1,
    padding_free: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π(y_t | prompt, y_<t) and entropy for the completion part of `input_ids` (B, P + N).

    One forward of the decoder, hidden states sliced to the N positions that predict completion tokens, then
    the LM head applied chunk by chunk (see `losses.token_logprobs_and_entropy`).

    `group_size` G > 1 says rows come in groups of G that share one prompt (rows g·G … g·G + G − 1, as the
    trainer lays them out): each prompt then goes through the model once, its keys and values are repeated
    for its G completions, and only the completions run at full batch — B/G·P + B·N positions instead of
    B·(P + N). Same values (the prompt rows are the same numbers), and gradients flow back through the
    repeat, so the result and its gradient equal the plain forward's up to float summation order. Under
    gradient checkpointing HF drops the cache inside its layers, so there the plain forward runs instead.

    `padding_free` (Gemma on cpu/cuda): `decoder.packed_completion_hidden` computes the real tokens only —
    no left padding, no padding after the stop tokens, each group's prompt once — and the LM head runs on
    the real completion tokens only; log-probs and entropies at padding are 0. The completion masks must be
    1 up to the stop token and 0 after it, as `sample` makes them.
    """
    hf = base_model(model)
    targets = input_ids[:, prompt_len:]
    softcap = getattr(hf.config, "final_logit_softcapping", None)
    checkpointing = hf.training and _checkpointing(hf)
    if padding_free and decoder.supports(hf) and host_syncs_are_cheap(input_ids.device) and not checkpointing:
        check_grouped(input_ids[:, :prompt_len], group_size)
        hidden, index = decoder.packed_completion_hidden(hf, input_ids, attention_mask, prompt_len, group_size)
        width = targets.shape[1]  # LM-head chunks of `width` real tokens, sized as for the padded forward
        rows = -(-index.numel() // width)
        hidden = torch.cat([hidden, hidden.new_zeros(rows * width - index.numel(), hidden.shape[1])]).view(rows, width, -1)
        flat_targets = targets.reshape(-1)[index]
        flat_targets = torch.cat([flat_targets, flat_targets.new_zeros(rows * width - index.numel())]).view(rows, width)
        logp, entropy = token_logprobs_and_entropy(hidden, hf.lm_head.weight, flat_targets, temperature, softcap, chunk_rows)

        def unpacked(x: torch.Tensor) -> torch.Tensor:
            return x.new_zeros(targets.numel()).index_copy(0, index, x.reshape(-1)[: index.numel()]).view_as(targets)

        return unpacked(logp), unpacked(entropy)
    if group_size > 1 and not checkpointing:
        hidden = _shared_prompt_hidden(hf, input_ids, attention_mask, prompt_len, group_size)
    else:
        # use_cache=False also avoids Gemma 3's sliding-window cache, which crashes on XLA
        hidden = hf.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state[:, prompt_len - 1 : -1, :]
    return token_logprobs_and_entropy(hidden, hf.lm_head.weight, targets, temperature, softcap, chunk_rows)


def _checkpointing(hf: torch.nn.Module) -> bool:
    return any(getattr(layer, "gradient_checkpointing", False) for layer in hf.model.layers)


def _shared_prompt_hidden(hf: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                          group_size: int) -> torch.Tensor:
    """Final hidden states at the N positions that predict completion tokens, running each group's prompt once."""
    total = input_ids.shape[1]
    check_grouped(input_ids[:, :prompt_len], group_size)
    prompt_ids, prompt_mask = input_ids[::group_size, :prompt_len], attention_mask[::group_size, :prompt_len]
    positions = position_ids_from_mask(prompt_mask)
    # A plain (full-length) cache on every layer: sliding-window layers still get their window from the
    # attention mask, and nothing is cropped between the two calls.
    cache = DynamicCache()
    prompt_out = hf.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                          past_key_values=cache, use_cache=True)
    if cache.get_seq_length() != prompt_len:  # a layer refused the cache: sharing would drop the prompt
        raise RuntimeError(f"{type(hf).__name__} did not fill the KV cache ({cache.get_seq_length()} of {prompt_len} positions); "
                           "run with GRPOConfig.share_prompt_forward=False")
    last_prompt = prompt_out.last_hidden_state[:, -1:, :].repeat_interleave(group_size, 0)
    if total - prompt_len == 1:  # one completion token: the prompt's last position predicts it
        return last_prompt
    cache.batch_repeat_interleave(group_size)
    completion_out = hf.model(
        input_ids=input_ids[:, prompt_len:-1], attention_mask=attention_mask[:, :-1],
        position_ids=position_ids_from_mask(attention_mask)[:, prompt_len:-1],
        past_key_values=cache, use_cache=True, cache_position=torch.arange(prompt_len, total - 1, device=input_ids.device),
    )
    return torch.cat([last_prompt, completion_out.last_hidden_state], dim=1)
