"""Lean Gemma forwards: the model's own weights and modules, attention written out, no HF bookkeeping.

HF's forward is general: per call it builds attention masks through its masking utilities, copies the
cached keys and values once per query head (grouped-query attention via `repeat_kv`) and goes through the
cache classes. A rollout calls it once per new token, so that bookkeeping costs as much as the arithmetic
on small models. And a padded batch computes every padding position. Here, for Gemma 2, Gemma 3 and Gemma 4
text models, two forwards:

- `forward` — rollouts: one (B, KV, T, D) key and value tensor per layer, written at a device-side index
  (one graph for every decode step on XLA);
- `packed_completion_hidden` — log-prob and training forwards (cpu/cuda): real tokens only, packed.

Both use the model's projections (LoRA layers included), MLPs, embeddings and rotary tables, so the numbers
are the model's numbers; Gemma's RMSNorm runs as one `F.rms_norm` with its scale (`norm_scale`).
Gemma 4's text layers add, each where the config has it: per-layer input embeddings (PLE: a residual
h + norm(proj(act(gate(h)) · ple_i)) after the MLP, ple_i from the model's own `get_per_layer_inputs` /
`project_per_layer_inputs`), a scalar per layer, values RMS-normed without a scale, keys as values on full
layers (`attention_k_eq_v`), per-kind head sizes and RoPE tables, and its last `num_kv_shared_layers` layers
reading the keys and values of the last earlier layer of their kind instead of their own (`kv_entries`).
Attention groups the query heads by key head instead of copying keys:

      scores = softcap·tanh((q kᵀ · scaling)/softcap) + bias,   out = softmax(scores) v,

with one additive bias per layer kind: 0 where key j is a real token, j ≤ i, and (sliding layers)
i − j < window; the lowest float elsewhere (so a row with no visible key stays finite). Logits are
softcap·tanh(lm_head(norm(h))/softcap) for the positions asked for only.

`supports(model)` says whether a model can use them; `sampling` falls back to HF's forward otherwise.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .cpu.products import PREPACK_MAX_ROWS, prepack_weight, prepacked_linear

GEMMA_LAYERS = ("Gemma2DecoderLayer", "Gemma3DecoderLayer", "Gemma4TextDecoderLayer")


def final_softcap(hf: torch.nn.Module) -> float | None:
    """The model's final logit softcap c (Gemma 2: logits → c·tanh(logits/c)); None where it has none."""
    return getattr(hf.config, "final_logit_softcapping", None)


def supports(hf: torch.nn.Module) -> bool:
    """True for a transformers Gemma 2 / Gemma 3 / Gemma 4 causal LM (text), the layers this module knows; not for
    Gemma 4's mixture-of-experts blocks (26B-A4B) or bidirectional attention."""
    layers = getattr(getattr(hf, "model", None), "layers", None)
    cfg = getattr(hf, "config", None)
    return (
        layers is not None and len(layers) > 0 and hasattr(hf, "lm_head")
        # FSDP2's sharded layers (`sharding`) are subclasses of the model's own
        and any(c.__name__ in GEMMA_LAYERS for c in type(layers[0]).__mro__)
        and not getattr(cfg, "enable_moe_block", False)
        and getattr(cfg, "use_bidirectional_attention", None) in (None, False, "vision"))  # "vision": image tokens only


def kv_entries(cfg: object) -> list[int]:
    """For each layer, the cache entry its attention reads. The layers that compute their own keys and values come
    first, so entry i is layer i's; Gemma 4's last `num_kv_shared_layers` layers compute none and each reads the
    entry of the last earlier layer of its kind (transformers' `kv_sharing_modes`: "store" there, "reuse" here)."""
    kinds = _layer_kinds(cfg)
    first_shared = cfg.num_hidden_layers - (getattr(cfg, "num_kv_shared_layers", 0) or 0)
    last_of_kind = {kinds[index]: index for index in range(first_shared)}
    return list(range(first_shared)) + [last_of_kind[kinds[i]] for i in range(first_shared, cfg.num_hidden_layers)]


@dataclasses.dataclass
class SharedPrefix:
    """The prompt part of a decode cache kept once per group of G consecutive rows that share their prompt
    (GRPO's groups): a decode step reads each prompt's keys and values once for its group instead of once per
    row (`KVCache.share_prefix`)."""

    keys: list[torch.Tensor]
    """Per layer (B/G, KV heads, P, head_dim)."""
    values: list[torch.Tensor]
    mask: torch.Tensor
    """(B/G, P) bool: the prompt slots that hold real tokens."""
    bias: torch.Tensor
    """(B/G, P) additive attention bias from `mask` (0 or the lowest float)."""
    group: int


@dataclasses.dataclass
class KVCache:
    """Keys and values per layer, each (B, KV heads, T, head_dim), plus which of the T slots hold real tokens.
    With a `prefix` the first P slots live there, once per group, and keys and values hold slots P … P + T − 1."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    key_mask: torch.Tensor
    """(B, T) bool: slot j holds a real token (left padding and never-written slots are False)."""
    key_bias: torch.Tensor | None = None
    """(B, T) additive attention bias from `key_mask` (0 or the lowest float), made by the first decode step
    that needs it and reused by the rest."""
    prefix: SharedPrefix | None = None
    """The prompt slots shared by each group of rows (`share_prefix`); None = every row holds all its slots."""

    @classmethod
    def empty(cls, hf: torch.nn.Module, batch: int, length: int, key_mask: torch.Tensor) -> KVCache:
        """Zeros for every cache entry (`kv_entries`), each (batch, its layer's KV heads, length, its head_dim)."""
        weight = hf.model.embed_tokens.weight
        entries = sorted(set(kv_entries(hf.config)))

        def zeros(index: int) -> torch.Tensor:
            attn = hf.model.layers[index].self_attn
            return weight.new_zeros(batch, kv_heads(attn), length, attn.head_dim)

        return cls([zeros(i) for i in entries], [zeros(i) for i in entries], key_mask.bool())

    def decode_bias(self, visible: int, dtype: torch.dtype) -> torch.Tensor:
        """(B, 1, 1, visible) bias for one new token written at slot visible − 1 (no window cuts into it): it
        sees every real key up to itself, so the bias depends on the key mask only."""
        if self.key_bias is None or self.key_bias.dtype != dtype:
            self.key_bias = additive_bias(self.key_mask, dtype)
        return self.key_bias[:, None, None, :visible]

    def select_rows(self, rows: torch.Tensor) -> KVCache:
        """The cache of the given batch rows only (finished rows leaving an eager rollout); a shared prefix is
        copied out to every row first (the rows left no longer come in whole groups)."""
        if self.prefix is not None:
            return self.unshared().select_rows(rows)
        return KVCache([k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values],
                       self.key_mask.index_select(0, rows),
                       self.key_bias.index_select(0, rows) if self.key_bias is not None else None)

    def repeat_interleave(self, repeats: int, key_mask: torch.Tensor) -> KVCache:
        """Each row `repeats` times in a row (a prompt's cache shared by its group), with a new key mask."""
        return KVCache([k.repeat_interleave(repeats, 0) for k in self.keys],
                       [v.repeat_interleave(repeats, 0) for v in self.values], key_mask.bool())

    def share_prefix(self, group: int, prompt_len: int) -> KVCache:
        """From a prefill's cache of one row per group (P prompt slots written, then the completion slots): the
        prompt slots kept once per group (`SharedPrefix`), and the completion slots G times, one per row — what
        `repeat_interleave` gives, without copying the prompt's keys to every row."""
        prompt_mask = self.key_mask[:, :prompt_len]
        prefix = SharedPrefix([k[:, :, :prompt_len].contiguous() for k in self.keys],
                              [v[:, :, :prompt_len].contiguous() for v in self.values], prompt_mask,
                              additive_bias(prompt_mask, self.keys[0].dtype), group)

        def completion_slots(x: torch.Tensor) -> torch.Tensor:  # (B·G, its KV heads, T − P, its head_dim) zeros
            batch, kv_heads, length, head_dim = x.shape
            return x.new_zeros(batch * group, kv_heads, length - prompt_len, head_dim)

        return KVCache([completion_slots(k) for k in self.keys], [completion_slots(v) for v in self.values],
                       self.key_mask[:, prompt_len:].repeat_interleave(group, 0), prefix=prefix)

    def unshared(self) -> KVCache:
        """The same cache with every row holding all its slots (the shared prefix copied to each row)."""
        if self.prefix is None:
            return self
        p, g = self.prefix, self.prefix.group
        return KVCache(
            [torch.cat([pk.repeat_interleave(g, 0), k], 2) for pk, k in zip(p.keys, self.keys, strict=True)],
            [torch.cat([pv.repeat_interleave(g, 0), v], 2) for pv, v in zip(p.values, self.values, strict=True)],
            torch.cat([p.mask.repeat_interleave(g, 0), self.key_mask], 1))


def shares_prefix(hf: torch.nn.Module, length: int) -> bool:
    """Whether a decode of `length` slots (prompt and completion) may keep the prompt's cache once per group
    (`KVCache.share_prefix`): no attention logit softcap, and no sliding window shorter than `length` (a window
    would cut into the prompt differently for every step)."""
    cfg = hf.config
    window = getattr(cfg, "sliding_window", None)
    return getattr(cfg, "attn_logit_softcapping", None) is None and (window is None or window >= length)


def attention_bias(key_mask: torch.Tensor, slots: torch.Tensor, window: int | None, dtype: torch.dtype) -> torch.Tensor:
    """(B, 1, S, T) additive bias for queries written at cache slots `slots` (S,): 0 where key slot j is a real
    token with j ≤ slot and, given a window, slot − j < window; the lowest `dtype` value elsewhere."""
    key_slots = torch.arange(key_mask.shape[1], device=key_mask.device)
    visible = key_slots[None, :] <= slots[:, None]
    if window is not None:
        visible = visible & (key_slots[None, :] > slots[:, None] - window)
    visible = visible[None, None] & key_mask[:, None, None, :]
    return additive_bias(visible, dtype)


def additive_bias(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `visible` (bool) is True, the lowest `dtype` value elsewhere: added to attention scores."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, torch.finfo(dtype).min)


def position_ids_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """Positions counting only real tokens (left padding gets position 0), as HF generate does."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def kv_heads(attn: torch.nn.Module) -> int:
    """Key (and value) heads of an attention module that computes its own keys (peft's LoRA layers carry
    `out_features` too)."""
    return attn.k_proj.out_features // attn.head_dim


def _layer_kinds(cfg: object) -> list[str]:
    kinds = getattr(cfg, "layer_types", None)
    return list(kinds) if kinds else ["full_attention"] * cfg.num_hidden_layers


@functools.cache
def _rotary_takes_layer_type(rotary_class: type) -> bool:
    return "layer_type" in inspect.signature(rotary_class.forward).parameters  # Gemma 3: local and global RoPE bases


def _rotary(
    hf: torch.nn.Module, h: torch.Tensor, positions: torch.Tensor, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = hf.model.rotary_emb
    if _rotary_takes_layer_type(type(rotary)):
        return rotary(h, positions, kind)
    return rotary(h, positions)


GEMMA_NORMS = ("Gemma2RMSNorm", "Gemma3RMSNorm", "Gemma4RMSNorm")


def norm_scale(module: torch.nn.Module) -> torch.Tensor | None:
    """The float32 scale s of a Gemma RMSNorm, y = x / √(mean(x²) + ε) · s: Gemma 2 and 3 store w with s = 1 + w,
    Gemma 4 stores s itself; None where there is none (Gemma 4's value norm)."""
    if type(module).__name__ != "Gemma4RMSNorm":
        return 1.0 + module.weight.float()
    return module.weight.float() if module.with_scale else None


LinearParts = tuple[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None", "torch.Tensor | None"]
"""(weight, bias, LoRA A, LoRA B · scaling) of a projection: y = x Wᵀ + b + (x Aᵀ)(s·B)ᵀ; no LoRA → A = B = None."""


def linear_parts(module: torch.nn.Module) -> LinearParts | None:
    """The tensors of a plain `nn.Linear`, or of a peft LoRA layer over one (active adapters summed: their A
    stacked, their s·B side by side), for rollouts to apply with three matmuls instead of peft's per-adapter
    module calls — same math, the LoRA weights are not merged into the base (in bf16 the small update
    would round away). None where the layer is something else (DoRA and other variants, LoRA biases,
    mixed dtypes, a merged layer with adapters disabled): it is then called as a module."""
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias, None, None
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(module, "lora_A") or getattr(module, "fan_in_fan_out", False):
        return None
    if module.disable_adapters:
        return None if module.merged else (base.weight, base.bias, None, None)
    if module.merged:
        return base.weight, base.bias, None, None
    a, b = [], []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        lora_a, lora_b = module.lora_A[name], module.lora_B[name]
        if (
            name in getattr(module, "lora_variant", {})
            or lora_b.bias is not None
            or type(lora_a) is not torch.nn.Linear
            or lora_a.weight.dtype != base.weight.dtype
        ):
            return None
        a.append(lora_a.weight)
        b.append(lora_b.weight * module.scaling[name])
    if not a:
        return base.weight, base.bias, None, None
    return base.weight, base.bias, torch.cat(a), torch.cat(b, dim=1)


def _stacked(parts: list[LinearParts]) -> LinearParts:
    """Projections of the same input as one: outputs stacked; LoRA B block-diagonal over the stacked A."""
    weight = torch.cat([p[0] for p in parts])
    bias = None
    if any(p[1] is not None for p in parts):
        bias = torch.cat([p[1] if p[1] is not None else p[0].new_zeros(p[0].shape[0]) for p in parts])
    if all(p[2] is None for p in parts):
        return weight, bias, None, None
    lora_dtype = next(p[2].dtype for p in parts if p[2] is not None)  # W may be cast to bf16, LoRA is not
    a = torch.cat([p[2] if p[2] is not None else p[0].new_zeros(0, p[0].shape[1], dtype=lora_dtype) for p in parts])
    b = torch.block_diag(
        *[p[3] if p[3] is not None else p[0].new_zeros(p[0].shape[0], 0, dtype=lora_dtype) for p in parts])
    return weight, bias, a, b


def _apply(parts: LinearParts, x: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """x Wᵀ + b (+ (x Aᵀ)(s·B)ᵀ with LoRA), returned in x's dtype. Each product runs in its weights' dtype: with
    W and b cast to bf16 (`Constants.build(product_dtype=…)`) x is rounded to bf16 for x Wᵀ only, and the LoRA
    path stays in x's dtype. `packed`: W prepacked (`products.prepack_weight`), which x Wᵀ then runs through."""
    weight, bias, lora_a, lora_b = parts
    xw = x.to(weight.dtype)
    y = (F.linear(xw, weight, bias) if packed is None else prepacked_linear(xw, packed, bias)).to(x.dtype)
    return y if lora_a is None else y + F.linear(F.linear(x.to(lora_a.dtype), lora_a), lora_b).to(x.dtype)


@dataclasses.dataclass
class Constants:
    """What every forward of one rollout (or one update) reuses: Gemma's norm scales and the RoPE tables.

    Gemma's RMSNorm is  y = x / √(mean(x²) + ε) · s,  computed in float32 (s = 1 + w on Gemma 2 and 3, w on
    Gemma 4: `norm_scale`); with s stored once it is one `F.rms_norm` call instead of ten small ops (same
    values). RoPE's cos and sin depend on the position only, so they are looked up in tables for positions
    0 … length − 1 per layer kind (the model's rotary module fills them, so the values are the model's, partial
    rotary included); `sin` is stored sign-folded, so rotating is x·cos + roll(x, D/2)·sin′ with
    sin′ = (−sin₁, sin₂) — the same numbers as x·cos + rotate_half(x)·sin.
    Built without gradients, for rollouts (eval mode: LoRA dropout off); forwards that train build it with
    `norms=False` (no cached scales, no `LinearParts`, no fused projections) and call the live modules.

    `product_dtype` (rollouts; `products.product_dtype`: bf16 for an fp32 model on a CPU with native bf16 products)
    casts each projection's W and b once per rollout, so its x Wᵀ reads half the bytes and runs on the bf16
    units; the LoRA A and B, the norms, the RoPE tables and the residual stream keep the model's dtype.
    """

    norm_scales: dict[int, torch.Tensor]
    """id(norm module) → its `norm_scale` (float32; None: no scale)."""
    tables: dict[str, tuple[torch.Tensor, torch.Tensor]]
    """layer kind → (cos, sign-folded sin), each (length, head_dim)."""
    linears: dict[int, LinearParts] = dataclasses.field(default_factory=dict)
    """id(projection module) → its `LinearParts` (rollouts only: plain `nn.Linear` and unmerged vanilla LoRA)."""
    fused_qkv: dict[int, tuple[LinearParts, torch.Tensor | None]] = dataclasses.field(default_factory=dict)
    """id(attention module) → (q, k and v as one `LinearParts` — weights and biases stacked, LoRA A stacked,
    LoRA B block-diagonal —, the q and k norm scales stacked per head or None): one matmul, one norm and one
    rotation for q and k together. Where all three have `LinearParts` and both norms share ε."""
    fused_gate_up: dict[int, LinearParts] = dataclasses.field(default_factory=dict)
    """id(MLP module) → its gate and up projections as one `LinearParts` (they read the same input): one product
    and one cast of x instead of two. Where both have `LinearParts`."""
    prepack: bool = False
    """Run a decode step's products (one position, at most `products.PREPACK_MAX_ROWS` rows) through each weight
    prepacked for oneDNN (`products.prepack_weight`, made at its first such product and kept in `packed`): rollouts on
    the CPU, whose weights do not change while they run (`build(prepack=True)`). A prefill's products stay plain,
    so how prompts are batched (one row per group, or every row) does not change which kernel runs."""
    packed: dict[int, torch.Tensor | None] = dataclasses.field(default_factory=dict)
    """id(W of a `LinearParts`) → W prepacked, or None where it cannot be (`products.prepack_weight`)."""
    entries: list[int] = dataclasses.field(default_factory=list)
    """Each layer's cache entry (`kv_entries`), worked out once per rollout rather than at every decode step."""

    @classmethod
    def build(
        cls, hf: torch.nn.Module, length: int, norms: bool = True, product_dtype: torch.dtype | None = None,
        prepack: bool = False,
    ) -> Constants:
        with torch.no_grad():
            scales = {id(m): norm_scale(m) for m in hf.modules() if norms and type(m).__name__ in GEMMA_NORMS}
            embedding = hf.model.embed_tokens.weight
            positions = torch.arange(length, device=embedding.device)[None]
            tables = {}
            for kind in set(_layer_kinds(hf.config)):
                cos, sin = (t[0] for t in _rotary(hf, embedding[:1], positions, kind))
                half = sin.shape[-1] // 2
                tables[kind] = (cos, torch.cat([-sin[:, :half], sin[:, half:]], dim=-1))
            linears, fused, fused_mlp = {}, {}, {}
            for layer in hf.model.layers if norms else ():
                attn, mlp = layer.self_attn, layer.mlp
                for module in _projections(layer):
                    parts = linear_parts(module)
                    if parts is not None:
                        linears[id(module)] = _cast_base(parts, product_dtype)
                gate_up = [linears.get(id(m)) for m in (mlp.gate_proj, mlp.up_proj)]
                if None not in gate_up:
                    fused_mlp[id(mlp)] = _stacked(gate_up)
                if getattr(attn, "k_proj", None) is None:
                    continue  # a KV-shared layer (Gemma 4) projects queries only
                qkv = [linears.get(id(m)) for m in _qkv_projections(attn)]
                q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
                if None in qkv or (q_norm is not None and q_norm.eps != k_norm.eps):
                    continue
                qk_scale = None
                if q_norm is not None:
                    heads = attn.q_proj.out_features // attn.head_dim
                    qk_scale = torch.stack([scales[id(q_norm)]] * heads + [scales[id(k_norm)]] * kv_heads(attn))
                fused[id(attn)] = (_stacked(qkv), qk_scale)
        return cls(scales, tables, linears, fused, fused_mlp, prepack=prepack, entries=kv_entries(hf.config))

    def apply(self, parts: LinearParts, x: torch.Tensor) -> torch.Tensor:
        """`_apply(parts, x)`, through W prepacked where `prepack` is on and x (rows, 1, in) is a decode step's."""
        packed = None
        if self.prepack and x.dim() == 3 and x.shape[1] == 1 and x.shape[0] <= PREPACK_MAX_ROWS:
            key = id(parts[0])
            if key not in self.packed:
                self.packed[key] = prepack_weight(parts[0])
            packed = self.packed[key]
        return _apply(parts, x, packed)

    def rope(self, kind: str, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sign-folded sin at `positions` (any shape) → (*positions.shape, head_dim) each."""
        cos, sin = self.tables[kind]
        return F.embedding(positions, cos), F.embedding(positions, sin)


def _qkv_projections(attn: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """The q, k and v projections an attention module has: Gemma 4's k = v layers have no v, its KV-shared layers
    neither k nor v."""
    projections = (attn.q_proj, getattr(attn, "k_proj", None), getattr(attn, "v_proj", None))
    return tuple(m for m in projections if m is not None)


def _projections(layer: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    """A decoder layer's projections: q, k, v (those it has), o, gate, up, down, and Gemma 4's PLE gate and
    projection."""
    attn, mlp = layer.self_attn, layer.mlp
    ple = tuple(getattr(layer, n) for n in ("per_layer_input_gate", "per_layer_projection") if hasattr(layer, n))
    return (*_qkv_projections(attn), attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj, *ple)


def frozen_linears(hf: torch.nn.Module, product_dtype: torch.dtype) -> dict[int, LinearParts]:
    """For a training forward: each projection whose base weight is frozen (LoRA), as `LinearParts` with W and b cast
    to `product_dtype` and the LoRA A and s·B live (gradients reach them). Layers with LoRA dropout in training mode,
    trainable base weights or anything `linear_parts` does not cover are left out (called as modules)."""
    linears = {}
    for layer in hf.model.layers:
        for module in _projections(layer):
            dropout = getattr(module, "lora_dropout", {})
            if module.training and any(type(d) is not torch.nn.Identity for d in dropout.values()):
                continue
            parts = linear_parts(module)
            if parts is not None and not parts[0].requires_grad and (parts[1] is None or not parts[1].requires_grad):
                with torch.no_grad():
                    linears[id(module)] = _cast_base(parts, product_dtype)
    return linears


def _cast_base(parts: LinearParts, dtype: torch.dtype | None) -> LinearParts:
    """W and b in `dtype` (None: as they are); LoRA A and B unchanged."""
    weight, bias, lora_a, lora_b = parts
    if dtype is None or weight.dtype == dtype:
        return parts
    return weight.to(dtype), bias.to(dtype) if bias is not None else None, lora_a, lora_b


def _norm(module: torch.nn.Module, x: torch.Tensor, consts: Constants | None = None) -> torch.Tensor:
    """Gemma's RMSNorm as one `F.rms_norm` (other norm classes: the module itself). Without a cached scale
    the scale is taken from the live weight, so gradients reach it."""
    if consts is not None and id(module) in consts.norm_scales:
        scale = consts.norm_scales[id(module)]
    elif type(module).__name__ in GEMMA_NORMS:
        scale = norm_scale(module)
    else:
        return module(x)
    if x.dtype == torch.float32:  # skips two no-op conversions: a rollout makes ~20 norm calls per token
        return F.rms_norm(x, x.shape[-1:], scale, module.eps)
    return F.rms_norm(x.float(), x.shape[-1:], scale, module.eps).to(x.dtype)


def _linear(module: torch.nn.Module, x: torch.Tensor, consts: Constants | None = None) -> torch.Tensor:
    """A projection through its `LinearParts` (rollouts), a plain `nn.Linear` as `F.linear` (no module call:
    a decode step makes ~25 of them, and the call machinery costs as much as the small matmul itself), and
    anything else (LoRA while training) through the module."""
    parts = consts.linears.get(id(module)) if consts is not None else None
    if parts is not None:
        return consts.apply(parts, x)
    if type(module) is torch.nn.Linear:
        return F.linear(x, module.weight, module.bias)
    return module(x)


def _activation(act: torch.nn.Module) -> object:
    """transformers' `GELUTanh` module as the function it wraps (no module call per use); others as they are."""
    return act.act if type(act).__name__ == "GELUTanh" else act


def _mlp(mlp: torch.nn.Module, x: torch.Tensor, consts: Constants | None = None) -> torch.Tensor:
    """Gemma's gated MLP, down(act(gate(x)) · up(x)), as HF computes it; transformers' `GELUTanh` module is
    called through the function it wraps."""
    act = _activation(mlp.act_fn)
    fused = consts.fused_gate_up.get(id(mlp)) if consts is not None else None
    if fused is not None:
        gate, up = consts.apply(fused, x).chunk(2, dim=-1)
        return _linear(mlp.down_proj, act(gate) * up, consts)
    return _linear(mlp.down_proj, act(_linear(mlp.gate_proj, x, consts)) * _linear(mlp.up_proj, x, consts), consts)


def _rotate(x: torch.Tensor, cos: torch.Tensor, folded_sin: torch.Tensor) -> torch.Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, -1) * folded_sin


def _attend(
    attn: torch.nn.Module, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of queries (B, H, S, D) over keys and values (B, KV, T, D) with an additive bias
    (B, 1, S, T); returns (B, S, H·D). The H/KV query heads that share a key head are stacked against that
    head's keys, so keys are never copied per query head."""
    batch, heads, length, head_dim = q.shape
    kv_heads = keys.shape[1]
    softcap = getattr(attn, "attn_logit_softcapping", None)
    if length == 1 and softcap is None and not attn.training and q.device.type == "cpu":
        # one query per row (decode steps on the CPU): the scaling and the bias ride on the score matmul
        # (`baddbmm`), faster on a CPU (docs/cpu_choices.md)
        rows = batch * kv_heads
        scores = torch.baddbmm(bias.expand(batch, kv_heads, 1, -1).reshape(rows, 1, -1),
                               q.reshape(rows, heads // kv_heads, head_dim),
                               keys.reshape(rows, -1, head_dim).transpose(1, 2), alpha=attn.scaling)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        return torch.bmm(weights, values.reshape(rows, -1, head_dim)).view(batch, 1, heads * head_dim)
    q = q.reshape(batch, kv_heads, heads // kv_heads * length, head_dim)
    scores = torch.matmul(q, keys.transpose(2, 3)) * attn.scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(batch, kv_heads, heads // kv_heads, length, -1) + bias.unsqueeze(1)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if attn.training and getattr(attn, "attention_dropout", 0.0):
        weights = F.dropout(weights, p=attn.attention_dropout)
    out = torch.matmul(weights.view(batch, kv_heads, heads // kv_heads * length, -1), values)
    return out.view(batch, heads, length, head_dim).transpose(1, 2).reshape(batch, length, heads * head_dim)


def _attend_shared(attn: torch.nn.Module, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *,
                   prefix: SharedPrefix, index: int) -> torch.Tensor:
    """`_attend` for one query per row (B, H, 1, D) over its group's prompt slots (`SharedPrefix`, layer `index`)
    and then its own completion slots (B, KV, t, D), all visible. One softmax over both parts: the scores against
    the prompt are computed per group — the G rows' queries stacked against the prompt's keys, read once — then
    laid out per row beside the completion scores; the prompt's weights go back the same way. Returns (B, 1, H·D)."""
    batch, heads, _, head_dim = q.shape
    kv_heads, g = keys.shape[1], prefix.group
    per, groups, prompt_len = heads // kv_heads, batch // g, prefix.keys[index].shape[2]

    def to_groups(x: torch.Tensor) -> torch.Tensor:  # (B·KV, H/KV, n) → (B/G·KV, G·H/KV, n)
        return x.view(groups, g, kv_heads, per, -1).transpose(1, 2).reshape(groups * kv_heads, g * per, -1)

    def to_rows(x: torch.Tensor) -> torch.Tensor:  # the way back
        return x.view(groups, kv_heads, g, per, -1).transpose(1, 2).reshape(batch * kv_heads, per, -1)

    rows_q = q.reshape(batch * kv_heads, per, head_dim)
    bias = (
        prefix.bias[:, None, None, :].expand(groups, kv_heads, 1, prompt_len).reshape(groups * kv_heads, 1, prompt_len))
    prompt_keys = prefix.keys[index].reshape(groups * kv_heads, prompt_len, head_dim)
    prompt_scores = torch.baddbmm(bias, to_groups(rows_q), prompt_keys.transpose(1, 2), alpha=attn.scaling)
    own_scores = torch.bmm(rows_q, keys.reshape(batch * kv_heads, -1, head_dim).transpose(1, 2)) * attn.scaling
    weights = torch.softmax(torch.cat([to_rows(prompt_scores), own_scores], -1), dim=-1, dtype=torch.float32).to(
        q.dtype)
    out = to_rows(torch.bmm(to_groups(weights[..., :prompt_len]),
                            prefix.values[index].reshape(groups * kv_heads, prompt_len, head_dim)))
    out = out + torch.bmm(weights[..., prompt_len:], values.reshape(batch * kv_heads, -1, head_dim))
    return out.view(batch, 1, heads * head_dim)


def _qkv(attn: torch.nn.Module, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         consts: Constants | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Projected, normed (Gemma 3 and 4) and rotated q, k and v for hidden states (..., hidden) → (..., heads, D);
    cos and sin broadcast against them. Gemma 4: v is RMS-normed without a scale (`v_norm`), on k = v layers from
    the keys' projection before their norm; a KV-shared layer returns k = v = None (it reads another layer's)."""
    head_dim = attn.head_dim
    if getattr(attn, "k_proj", None) is None:
        q = _linear(attn.q_proj, x, consts).unflatten(-1, (-1, head_dim))
        return _rotate(_norm(attn.q_norm, q, consts), cos, sin), None, None
    kv = kv_heads(attn)
    fused = consts.fused_qkv.get(id(attn)) if consts is not None else None
    if fused is not None:
        parts, qk_scale = fused
        qkv = consts.apply(parts, x).unflatten(-1, (-1, head_dim))
        # v's heads come last; without a v projection (k = v) the values are the keys' heads, as projected
        qk = qkv[..., :-kv, :] if getattr(attn, "v_proj", None) is not None else qkv
        v = qkv[..., -kv:, :]
        if qk_scale is not None:
            qk = (F.rms_norm(qk.float(), (head_dim,), eps=attn.q_norm.eps) * qk_scale).to(x.dtype)
        qk = _rotate(qk, cos, sin)
        q, k = qk[..., :-kv, :], qk[..., -kv:, :]
    else:
        q = _linear(attn.q_proj, x, consts).unflatten(-1, (-1, head_dim))
        k = _linear(attn.k_proj, x, consts).unflatten(-1, (-1, head_dim))
        v = _linear(attn.v_proj, x, consts).unflatten(-1, (-1, head_dim)) if attn.v_proj is not None else k
        if getattr(attn, "q_norm", None) is not None:  # Gemma 3 and 4
            q, k = _norm(attn.q_norm, q, consts), _norm(attn.k_norm, k, consts)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    if getattr(attn, "v_norm", None) is not None:  # Gemma 4
        v = _norm(attn.v_norm, v, consts)
    return q, k, v


class KindInputs(NamedTuple):
    """What every layer of one kind (sliding or full attention) attends with in a forward: its RoPE tables for the
    new tokens' positions, each (B, S, D), and its additive attention bias (None: no bias is needed)."""

    cos: torch.Tensor
    sin: torch.Tensor
    bias: torch.Tensor | None


def _attention(layer: torch.nn.Module, h: torch.Tensor, kind: KindInputs, *, cache: KVCache, entry: int,
               slots: torch.Tensor, consts: Constants, visible: int | None) -> torch.Tensor:
    """A layer's attention for S new tokens over cache entry `entry` (`kv_entries`): their keys and values written
    there at `slots` (a KV-shared layer writes nothing: it reads what its entry's layer wrote), then attention over
    the first `visible` slots (all when None). The cache and the attention products stay in the model's dtype with
    bf16 projections too: on the CPU a bf16 batched product over the first `visible` slots of a longer cache copies
    its operands, where fp32's reads them strided (docs/cpu_choices.md)."""
    attn, cos, sin, bias = layer.self_attn, kind.cos, kind.sin, kind.bias
    q, k, v = _qkv(attn, h, cos.unsqueeze(2), sin.unsqueeze(2), consts)  # (B, S, heads, D)
    # with a shared prefix (decode steps) the prompt's slots are there and the cache holds the slots after them
    offset = cache.prefix.keys[entry].shape[2] if cache.prefix is not None else 0
    end = None if visible is None else visible - offset
    keys, values = cache.keys[entry], cache.values[entry]
    if k is not None:
        slots = slots - offset if offset else slots  # no extra op (nor graph change on XLA) without a prefix
        keys, values = keys.index_copy_(2, slots, k.transpose(1, 2)), values.index_copy_(2, slots, v.transpose(1, 2))
    keys, values = keys[:, :, :end], values[:, :, :end]
    if cache.prefix is not None:
        attended = _attend_shared(attn, q.transpose(1, 2), keys, values, prefix=cache.prefix, index=entry)
    else:
        attended = _attend(attn, q.transpose(1, 2), keys, values, bias)
    return _linear(attn.o_proj, attended, consts)


def _per_layer_input(layer: torch.nn.Module, h: torch.Tensor, ple: torch.Tensor | None,
                     consts: Constants | None) -> torch.Tensor:
    """The end of a Gemma 4 layer: h + norm(proj(act(gate(h)) · ple)) with the layer's PLE input `ple` (..., P),
    then h times the layer's scalar. Other layers: h."""
    if ple is not None:
        gated = _activation(layer.act_fn)(_linear(layer.per_layer_input_gate, h, consts)) * ple
        h = h + _norm(layer.post_per_layer_input_norm, _linear(layer.per_layer_projection, gated, consts), consts)
    scalar = getattr(layer, "layer_scalar", None)
    return h if scalar is None else h * scalar


def per_layer_inputs(hf: torch.nn.Module, input_ids: torch.Tensor, h: torch.Tensor) -> torch.Tensor | None:
    """Gemma 4's per-layer inputs (*input_ids.shape, layers, P) for tokens `input_ids` with embeddings `h`, by the
    model's own `get_per_layer_inputs` and `project_per_layer_inputs`; None for a model without them."""
    model = hf.model
    if not getattr(model, "hidden_size_per_layer_input", None):
        return None
    return model.project_per_layer_inputs(h, model.get_per_layer_inputs(input_ids))


LM_HEAD_BLOCK = 4096
"""Vocabulary entries per block of a decode step's LM head on the CPU (a 4096 × 640 fp32 block is 10 MiB)."""


def lm_head_logits(head: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Logits x Wᵀ for the last positions x (B, d). On the CPU with a large vocabulary and a decode-sized batch
    this is block by block of W as W_blk xᵀ, with the small product written into place: each block of W streams
    through once against a cache-resident xᵀ (faster than `F.linear` for Gemma's 262k-entry head:
    docs/cpu_choices.md), equal to it up to float summation order. Elsewhere: the module as it is."""
    weight = getattr(head, "weight", None)
    if (type(head) is not torch.nn.Linear or head.bias is not None or x.device.type != "cpu" or x.dim() != 2
            or x.shape[0] > 64 or weight.shape[0] < 8 * LM_HEAD_BLOCK):
        return _linear(head, x)
    logits = x.new_empty(x.shape[0], weight.shape[0])
    xt = x.T.contiguous()
    for start in range(0, weight.shape[0], LM_HEAD_BLOCK):
        logits[:, start : start + LM_HEAD_BLOCK] = torch.mm(weight[start : start + LM_HEAD_BLOCK], xt).T
    return logits


FORWARD_OUTPUTS = ("last_logits", "all_logits", "last_hidden")
"""What `forward` returns: logits (B, V) for the last new token, logits (B, S, V) for every new token, or the last
token's final normed hidden state (B, d), for a caller that applies the LM head (and any final softcap) itself."""


def forward(hf: torch.nn.Module, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache, start: torch.Tensor,
            consts: Constants, *, visible: int | None = None, output: str = "last_logits") -> torch.Tensor:
    """Run S new tokens (B, S) at RoPE positions (B, S), written to cache slots start … start + S − 1 (`start`
    a one-element device tensor, so every decode step is the same graph); returns what `output` names
    (`FORWARD_OUTPUTS`). `visible` (a host int, eager cpu/cuda only) limits attention to the first `visible` cache
    slots — the ones written so far, so `start` + S — instead of all of them behind a mask."""
    if output not in FORWARD_OUTPUTS:
        raise ValueError(f"forward(output={output!r}): one of {', '.join(FORWARD_OUTPUTS)}")
    cfg = hf.config
    model = hf.model
    slots = start + torch.arange(input_ids.shape[1], device=input_ids.device)
    h = model.embed_tokens(input_ids)
    kinds = _layer_kinds(cfg)
    key_mask = cache.key_mask[:, :visible]
    inputs = {}
    for kind in set(kinds):
        cos, sin = consts.rope(kind, positions)
        window = cfg.sliding_window if kind == "sliding_attention" else None
        if cache.prefix is not None:
            bias = None  # every completion slot so far is visible; the prompt's bias is in the prefix
        elif visible is not None and input_ids.shape[1] == 1 and (window is None or window >= visible):
            bias = cache.decode_bias(visible, h.dtype)  # one op instead of ~8 per step
        else:
            bias = attention_bias(key_mask, slots, window, h.dtype)
        inputs[kind] = KindInputs(cos, sin, bias)
    ple = per_layer_inputs(hf, input_ids, h)  # (B, S, layers, P) or None
    layers, entries = model.layers, consts.entries
    for index in range(cfg.num_hidden_layers):
        layer = layers[index]
        if entries[index] != index and output != "all_logits" and h.shape[1] > 1:
            # KV-shared layers write no cache: only the last position, whose logits are asked for, goes on
            h, ple = h[:, -1:], ple[:, -1:] if ple is not None else None
            inputs = {kind: KindInputs(x.cos[:, -1:], x.sin[:, -1:], x.bias[:, :, -1:] if x.bias is not None else None)
                      for kind, x in inputs.items()}
        attended = _attention(layer, _norm(layer.input_layernorm, h, consts), inputs[kinds[index]], cache=cache,
                              entry=entries[index], slots=slots, consts=consts, visible=visible)
        h = h + _norm(layer.post_attention_layernorm, attended, consts)
        h = h + _norm(layer.post_feedforward_layernorm,
                      _mlp(layer.mlp, _norm(layer.pre_feedforward_layernorm, h, consts), consts), consts)
        h = _per_layer_input(layer, h, ple[:, :, index] if ple is not None else None, consts)
    if output != "all_logits":
        h = h[:, -1, :]
    h = _norm(model.norm, h, consts)
    if output == "last_hidden":
        return h
    logits = lm_head_logits(hf.lm_head, h)
    softcap = final_softcap(hf)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


@functools.cache
def compiled_forward() -> object:
    """`forward` under `torch.compile` (static shapes): inductor fuses the norms, rotary, softmax and sampling
    arithmetic around the matmuls. Compiles once per model and shape (prompt bucket, batch), then reuses."""
    return torch.compile(forward, dynamic=False)


@dataclasses.dataclass
class _Packing:
    """Where the real tokens of (B, P + N) rows sit once packed: each group's prompt once, then every completion
    token but the last (the last predicts nothing)."""

    prompt_mask: torch.Tensor
    """(B/G, P) bool, one row per group."""
    input_mask: torch.Tensor
    """(B, N − 1) bool: completion tokens fed to the model."""
    target_mask: torch.Tensor
    """(B, N) bool: completion tokens predicted."""
    prompt_index: torch.Tensor
    """Flat indices of the real prompt tokens in (B/G · P)."""
    input_index: torch.Tensor
    """Flat indices of the real fed completion tokens in (B · (N − 1))."""
    tokens: torch.Tensor
    """(M,) the packed token ids: prompts first, then completions."""
    positions: torch.Tensor
    """(M,) their RoPE positions."""
    group_size: int

    @classmethod
    def build(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, group_size: int) -> _Packing:
        mask, g = attention_mask.bool(), group_size
        prompt_mask, input_mask, target_mask = mask[::g, :prompt_len], mask[:, prompt_len:-1], mask[:, prompt_len:]
        if (target_mask[:, 1:] & ~input_mask).any():
            raise ValueError("completion masks must be 1 up to the stop token and 0 after it (a gap was found)")
        positions = position_ids_from_mask(mask)
        prompt_index = prompt_mask.reshape(-1).nonzero().squeeze(1)
        input_index = input_mask.reshape(-1).nonzero().squeeze(1)
        tokens = torch.cat(
            [input_ids[::g, :prompt_len].reshape(-1)[prompt_index],
             input_ids[:, prompt_len:-1].reshape(-1)[input_index]]
        )
        token_pos = torch.cat(
            [positions[::g, :prompt_len].reshape(-1)[prompt_index],
             positions[:, prompt_len:-1].reshape(-1)[input_index]]
        )
        return cls(prompt_mask=prompt_mask, input_mask=input_mask, target_mask=target_mask, prompt_index=prompt_index,
                   input_index=input_index, tokens=tokens, positions=token_pos, group_size=g)

    @property
    def n_prompt(self) -> int:
        return self.prompt_index.numel()

    def prediction_sources(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed position of the hidden state that predicts each real completion token, its flat index b·N + j):
        completion token 0 is predicted by its prompt's last token, token j > 0 by completion token j − 1."""
        batch, new = self.target_mask.shape
        target_index = self.target_mask.reshape(-1).nonzero().squeeze(1)
        row, col = target_index // new, target_index % new
        last_prompt = self.prompt_mask.sum(1).cumsum(0) - 1
        input_rank = torch.full((batch * max(new - 1, 1),), -1, dtype=torch.long, device=target_index.device)
        input_rank[self.input_index] = torch.arange(self.input_index.numel(), device=target_index.device)
        source = torch.where(col == 0, last_prompt[row // self.group_size],
                             self.n_prompt + input_rank[(row * (new - 1) + col - 1).clamp(min=0)])
        return source, target_index


def _unpack(x: torch.Tensor, index: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """(m, heads, D) real tokens → (rows, heads, width, D) with zeros at padding."""
    padded = x.new_zeros(rows * width, *x.shape[1:]).index_copy(0, index, x)
    return padded.view(rows, width, *x.shape[1:]).transpose(1, 2)


def _repack(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).index_select(0, index)


def _packed_attention(attn: torch.nn.Module, qkv: tuple[torch.Tensor, ...], pack: _Packing,
                      biases: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Attention over packed (M, heads, D) queries, keys and values: the prompts against themselves, the
    completions against their group's prompt and their own earlier tokens (`biases`: prompt, completion)."""
    q, k, v = qkv
    n, (groups, plen), (batch, fed) = pack.n_prompt, pack.prompt_mask.shape, pack.input_mask.shape
    prompt_k, prompt_v = (_unpack(x[:n], pack.prompt_index, groups, plen) for x in (k, v))
    prompt_q = _unpack(q[:n], pack.prompt_index, groups, plen)
    out = [_repack(_attend(attn, prompt_q, prompt_k, prompt_v, biases[0]), pack.prompt_index)]
    if fed:
        g = pack.group_size
        keys = torch.cat([prompt_k.repeat_interleave(g, 0), _unpack(k[n:], pack.input_index, batch, fed)], 2)
        values = torch.cat([prompt_v.repeat_interleave(g, 0), _unpack(v[n:], pack.input_index, batch, fed)], 2)
        queries = _unpack(q[n:], pack.input_index, batch, fed)
        out.append(_repack(_attend(attn, queries, keys, values, biases[1]), pack.input_index))
    return torch.cat(out)


def packed_completion_hidden(hf: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                             prompt_len: int, group_size: int = 1, *,
                             product_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Final (normed) hidden states that predict the real completion tokens, without computing any padding.

    Rows are (B, P + N): left-padded prompts, then completions whose mask is 1 up to and including the stop
    token. Every projection, norm and MLP runs on the real tokens only, packed into one (M, hidden) matrix:
    each group's prompt once (rows come in groups of G sharing a prompt, as in `sampling.sample`), then every
    completion token but the last. Attention unpacks them into two padded blocks — the prompts against
    themselves, the completions against their group's prompt and their own earlier tokens — with the same
    causal, padding and sliding-window rule as `attention_bias`. Returns (hidden (T, hidden), index (T,)):
    the hidden state predicting completion token j of row b sits at flat index b·N + j, for the T real ones.

    Reads the masks on the host (the packed sizes depend on them), so for cpu/cuda; autograd flows through
    everything, so it serves the training forward as well as the log-prob forwards. `product_dtype` (bf16 on a CPU
    with native bf16 products): the frozen base weights' products x Wᵀ run in it (`frozen_linears`, cast once per
    call); LoRA, norms, attention and the residual stream stay in the model's dtype, and so do all gradients.
    """
    cfg, model, device = hf.config, hf.model, input_ids.device
    pack = _Packing.build(input_ids, attention_mask, prompt_len, group_size)
    kinds = _layer_kinds(cfg)
    consts = Constants.build(hf, int(pack.positions.max()) + 1, norms=False)  # norms stay live: they may be trained
    if product_dtype is not None and product_dtype != model.embed_tokens.weight.dtype:
        consts.linears = frozen_linears(hf, product_dtype)
    completion_keys = torch.cat([pack.prompt_mask.repeat_interleave(group_size, 0), pack.input_mask], dim=1)
    h = model.embed_tokens(pack.tokens)
    tables, biases = {}, {}
    for kind in set(kinds):
        tables[kind] = tuple(t.unsqueeze(1) for t in consts.rope(kind, pack.positions))
        window = cfg.sliding_window if kind == "sliding_attention" else None
        biases[kind] = (attention_bias(pack.prompt_mask, torch.arange(prompt_len, device=device), window, h.dtype),
                        attention_bias(completion_keys, torch.arange(prompt_len, input_ids.shape[1] - 1, device=device),
                                       window, h.dtype))
    ple = per_layer_inputs(hf, pack.tokens, h)  # (M, layers, P) or None
    computed = {}  # layer index → its (k, v), for the KV-shared layers that read them
    for index, (layer, kind, entry) in enumerate(zip(model.layers[: cfg.num_hidden_layers], kinds, consts.entries,
                                                     strict=True)):
        attn = layer.self_attn
        q, k, v = _qkv(attn, _norm(layer.input_layernorm, h), *tables[kind], consts)  # (M, heads, D)
        if k is None:
            k, v = computed[entry]
        computed[index] = k, v
        h = h + _norm(layer.post_attention_layernorm,
                      _linear(attn.o_proj, _packed_attention(attn, (q, k, v), pack, biases[kind]), consts))
        h = h + _norm(
            layer.post_feedforward_layernorm, _mlp(layer.mlp, _norm(layer.pre_feedforward_layernorm, h), consts)
        )
        h = _per_layer_input(layer, h, ple[:, index] if ple is not None else None, consts)
    source, target_index = pack.prediction_sources()
    return _norm(model.norm, h.index_select(0, source)), target_index
