"""A lean Gemma forward for rollouts: the model's own modules, a plain static KV cache, attention written out.

HF's forward is general: per call it builds attention masks through its masking utilities, copies the
cached keys and values once per query head (grouped-query attention via `repeat_kv`) and goes through the
cache classes. A rollout calls it once per new token, so that bookkeeping costs as much as the arithmetic
on small models. Here, for Gemma 2 and Gemma 3 text models:

- projections, norms, activations, embeddings and rotary tables are the model's own modules (LoRA layers
  included), so the numbers are the model's numbers;
- the cache is one (B, KV, T, D) key and one value tensor per layer, written at a device-side index (one
  graph for every decode step on XLA);
- attention groups the query heads by key head instead of copying keys:

      scores = softcap·tanh((q kᵀ · scaling)/softcap) + bias,   out = softmax(scores) v,

  with one additive bias per step and layer kind: 0 where key j is a real token, j ≤ i, and (sliding
  layers) i − j < window; the lowest float elsewhere (so a row with no visible key stays finite);
- logits = softcap·tanh(lm_head(norm(h))/softcap) for the positions asked for only.

`supports(model)` says whether a model can use it; `sampling.sample` falls back to HF's forward otherwise.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch

GEMMA_LAYERS = ("Gemma2DecoderLayer", "Gemma3DecoderLayer")


def supports(hf: torch.nn.Module) -> bool:
    """True for a transformers Gemma 2 / Gemma 3 causal LM (text), the layers this module knows."""
    layers = getattr(getattr(hf, "model", None), "layers", None)
    return layers is not None and len(layers) > 0 and type(layers[0]).__name__ in GEMMA_LAYERS and hasattr(hf, "lm_head")


@dataclass
class KVCache:
    """Keys and values per layer, each (B, KV heads, T, head_dim), plus which of the T slots hold real tokens."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_mask: torch.Tensor
    """(B, T) bool: slot j holds a real token (left padding and never-written slots are False)."""

    @classmethod
    def empty(cls, hf: torch.nn.Module, batch: int, length: int, key_mask: torch.Tensor) -> KVCache:
        cfg = hf.config
        weight = hf.model.embed_tokens.weight
        shape = (batch, cfg.num_key_value_heads, length, cfg.head_dim)
        layers = range(cfg.num_hidden_layers)
        return cls([weight.new_zeros(shape) for _ in layers], [weight.new_zeros(shape) for _ in layers], key_mask.bool())

    def repeat_interleave(self, repeats: int, key_mask: torch.Tensor) -> KVCache:
        """Each row `repeats` times in a row (a prompt's cache shared by its group), with a new key mask."""
        return KVCache([k.repeat_interleave(repeats, 0) for k in self.keys],
                       [v.repeat_interleave(repeats, 0) for v in self.values], key_mask.bool())


def attention_bias(key_mask: torch.Tensor, slots: torch.Tensor, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, S, T) additive bias for queries written at cache slots `slots` (S,): 0 where key slot j is a real
    token with j ≤ slot and, given a window, slot − j < window; the lowest `dtype` value elsewhere."""
    key_slots = torch.arange(key_mask.shape[1], device=key_mask.device)
    visible = key_slots[None, :] <= slots[:, None]
    if window is not None:
        visible = visible & (key_slots[None, :] > slots[:, None] - window)
    visible = visible[None, None] & key_mask[:, None, None, :]
    return torch.zeros(visible.shape, dtype=dtype, device=key_mask.device).masked_fill(~visible, torch.finfo(dtype).min)


def _layer_kinds(cfg: object) -> list[str]:
    kinds = getattr(cfg, "layer_types", None)
    return list(kinds) if kinds else ["full_attention"] * cfg.num_hidden_layers


@functools.cache
def _rotary_takes_layer_type(rotary_class: type) -> bool:
    return "layer_type" in inspect.signature(rotary_class.forward).parameters  # Gemma 3: local and global RoPE bases


def _rotary(hf: torch.nn.Module, h: torch.Tensor, positions: torch.Tensor, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = hf.model.rotary_emb
    if _rotary_takes_layer_type(type(rotary)):
        return rotary(h, positions, kind)
    return rotary(h, positions)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _attention(layer: torch.nn.Module, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache, index: int,
               slots: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    attn = layer.self_attn
    batch, length, _ = h.shape
    head_dim, kv_heads = attn.head_dim, cache.keys[index].shape[1]
    q = attn.q_proj(h).view(batch, length, -1, head_dim).transpose(1, 2)  # (B, H, S, D)
    k = attn.k_proj(h).view(batch, length, kv_heads, head_dim).transpose(1, 2)
    v = attn.v_proj(h).view(batch, length, kv_heads, head_dim).transpose(1, 2)
    if getattr(attn, "q_norm", None) is not None:  # Gemma 3
        q, k = attn.q_norm(q), attn.k_norm(k)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    keys = cache.keys[index].index_copy_(2, slots, k)
    values = cache.values[index].index_copy_(2, slots, v)
    heads = q.shape[1]
    # (B, KV, H/KV · S, D): the query heads that share a key head, stacked, against that head's keys
    q = q.reshape(batch, kv_heads, heads // kv_heads * length, head_dim)
    scores = torch.matmul(q, keys.transpose(2, 3)) * attn.scaling
    softcap = getattr(attn, "attn_logit_softcapping", None)
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, kv_heads, heads // kv_heads, length, -1) + bias.unsqueeze(1)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights.view(batch, kv_heads, heads // kv_heads * length, -1), values)
    out = out.view(batch, heads, length, head_dim).transpose(1, 2).reshape(batch, length, heads * head_dim)
    return attn.o_proj(out)


def forward(hf: torch.nn.Module, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: torch.Tensor,
            logits_for_last: bool = True) -> torch.Tensor:
    """Run S new tokens (B, S) at RoPE positions (B, S), written to cache slots start … start + S − 1 (`start`
    a one-element device tensor, so every decode step is the same graph); returns logits (B, V) for the last
    token (or (B, S, V) for all)."""
    cfg = hf.config
    model = hf.model
    slots = start + torch.arange(input_ids.shape[1], device=input_ids.device)
    h = model.embed_tokens(input_ids)
    kinds = _layer_kinds(cfg)
    tables, biases = {}, {}
    for kind in set(kinds):
        tables[kind] = _rotary(hf, h, positions, kind)
        window = cfg.sliding_window if kind == "sliding_attention" else None
        biases[kind] = attention_bias(cache.key_mask, slots, window, h.dtype)
    for index, layer in enumerate(model.layers[: cfg.num_hidden_layers]):
        cos, sin = tables[kinds[index]]
        attended = _attention(layer, layer.input_layernorm(h), cos, sin, cache, index, slots, biases[kinds[index]])
        h = h + layer.post_attention_layernorm(attended)
        h = h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
    if logits_for_last:
        h = h[:, -1, :]
    logits = hf.lm_head(model.norm(h))
    softcap = getattr(cfg, "final_logit_softcapping", None)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


@functools.cache
def compiled_forward() -> object:
    """`forward` under `torch.compile` (static shapes): inductor fuses the norms, rotary, softmax and sampling
    arithmetic around the matmuls. Compiles once per model and shape (prompt bucket, batch), then reuses."""
    return torch.compile(forward, dynamic=False)
