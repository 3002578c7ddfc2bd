"""The fixed-shape sampler and the log-prob forward.

Static shapes everywhere, so XLA compiles a handful of graphs once and then only runs them:
- prompts are left-padded to a multiple of `bucket` (a few buckets in all);
- the completion buffer is always `max_new_tokens` long; finished rows keep running, writing `<pad>`;
- one prefill forward fills a static KV cache of length P + N, then N − 1 single-token decode forwards
  read and write it at a device-side position (no `.item()`, no Python `if` on device values).
On CPU/GPU the loop may stop early when every row has finished (a cheap host check there); on XLA it
never looks at device values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from transformers import StaticCache

from .device import is_xla, mark_step
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

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)


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


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens (left padding gets position 0), as HF generate does."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def choose_tokens(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, greedy: bool = False,
    noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return (tokens, log-prob under the temperature-scaled distribution).

    Sampling is Gumbel-max over the filtered logits: argmax(z + g) with g = −log(−log u), u ~ U(0, 1) —
    no multinomial, no host sync. `noise` (B, V) of uniforms may be supplied for reproducibility.
    """
    logits = logits.float()
    scaled = logits / max(temperature, 1e-5)
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
        u = noise if noise is not None else torch.rand_like(filtered)
        gumbel = -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))
        tokens = (filtered + gumbel).argmax(dim=-1)
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
) -> Rollout:
    """Generate `max_new_tokens` for every row with a static KV cache; everything after a stop token is
    masked and set to `pad_id`. Prompts are (B, P) left-padded; the model's device is used throughout."""
    device = next(model.parameters()).device
    xla = is_xla(device)
    was_training = model.training
    model.eval()
    batch, plen = prompt_ids.shape
    total = plen + max_new_tokens
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    hf = base_model(model)
    cache = StaticCache(config=hf.config, max_cache_len=total)
    full_mask = torch.cat([prompt_mask, torch.ones(batch, max_new_tokens, dtype=prompt_mask.dtype, device=device)], 1)
    positions = position_ids_from_mask(prompt_mask)
    stop = torch.tensor(stop_ids, device=device)

    def draw(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        noise = None
        if not greedy and generator is not None:
            noise = torch.rand(logits.shape, generator=generator, device=generator.device).to(device)
        return choose_tokens(logits, temperature, top_k, top_p, greedy, noise)

    out = model(
        input_ids=prompt_ids, attention_mask=full_mask, position_ids=positions, past_key_values=cache,
        cache_position=torch.arange(plen, device=device), use_cache=True, logits_to_keep=1,
    )
    token, logprob = draw(out.logits[:, -1, :])
    tokens = torch.full((batch, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((batch, max_new_tokens), device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    mask = torch.zeros((batch, max_new_tokens), dtype=torch.long, device=device)
    next_pos = positions[:, -1:] + 1
    cache_pos = torch.tensor([plen], device=device)
    for t in range(max_new_tokens):
        tokens[:, t] = torch.where(alive, token, torch.full_like(token, pad_id))
        logprobs[:, t] = torch.where(alive, logprob, torch.zeros_like(logprob))
        mask[:, t] = alive.long()
        alive = alive & ~torch.isin(token, stop)
        if t == max_new_tokens - 1:
            break
        if not xla and not bool(alive.any()):
            break
        out = model(
            input_ids=tokens[:, t : t + 1], attention_mask=full_mask, position_ids=next_pos, past_key_values=cache, cache_position=cache_pos,
            use_cache=True,
        )
        token, logprob = draw(out.logits[:, -1, :])
        next_pos = next_pos + 1
        cache_pos = cache_pos + 1
        mark_step(device)
    if was_training:
        model.train()
    return Rollout(prompt_ids, prompt_mask, tokens, mask, logprobs, alive)


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_len: int,
    temperature: float = 1.0,
    chunk_rows: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π(y_t | prompt, y_<t) and entropy for the completion part of `input_ids` (B, P + N).

    One forward of the decoder (no KV cache: `use_cache=False`, which also avoids Gemma 3's sliding-window
    cache on XLA), hidden states sliced to the N positions that predict completion tokens, then the LM head
    applied chunk by chunk (see `losses.token_logprobs_and_entropy`).
    """
    hf = base_model(model)
    decoder = hf.model
    hidden = decoder(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    ).last_hidden_state
    hidden = hidden[:, prompt_len - 1 : -1, :]
    targets = input_ids[:, prompt_len:]
    softcap = getattr(hf.config, "final_logit_softcapping", None)
    return token_logprobs_and_entropy(hidden, hf.lm_head.weight, targets, temperature, softcap, chunk_rows)
