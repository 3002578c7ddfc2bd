"""Memory planner: will this GRPO run fit on this accelerator, and with which settings?

Per device, in bytes (n = devices sharing the batch, b = bytes per weight element, T = prompt + completion):

    weights      P_base · b                       (replicated; /n when full fine-tuning shards FSDP-style)
    trainable    P_lora · 4                       LoRA factors stay fp32 (peft upcasts them)
    gradients    P_train · 4 (LoRA) or P · b / n (full fine-tuning, sharded)
    optimizer    2 × the gradients                AdamW's two moments, in the parameters' dtype
    fsdp gather  2 layers' weights · b            full fine-tuning over n > 1 devices: gathered for compute
    reference    P_base · b / n                   a frozen copy, full fine-tuning with β > 0 only
    activations  r · T · L · (c_h·h + c_i·i + c_a·H·T) · b     r = micro-batch rows per device;
                 with checkpointing: r · T · L · h · b + one layer's worth
    logits       c · N · V · 4 · 6                one chunk of c rows of fp32 logits over the N completion
                                                  positions (logprobs.logit_chunk_rows), recomputed in the
                                                  backward: logits, shifted logits, softmax, the entropy's
                                                  p·z product and two gradients live at once
    kv cache     R · T · L · 2 · K · d · b        R = rollout rows per device (prompts × group / n); Gemma 4:
                                                  Σ over the layers that store keys and values of 2 · K_l · d_l
    rollout      R · V · 4 · 3                    the last position's logits while sampling
    gathered     P_base · b · (1 − 1/n)           full fine-tuning over n > 1 GPUs (torchrun): the rollout samples
                                                  on whole weights, the other processes' shards gathered
    prefill      R · P · (4h + 3i + 2·H·T) · b    one layer's transient tensors during the prompt forward
    qkv stacked  L · (H + 2K) · d · h · b         each layer's q, k and v weights stacked for the rollout's
                                                  one-matmul projection (decoder.Constants), rebuilt per rollout

    peak = weights + trainable + gradients + optimizer + reference + fsdp gather
           + max(training: activations + logits,  rollout: kv cache + rollout + prefill + qkv stacked + gathered)
           + 10 % margin

The activation coefficients (c_h = 22, c_i = 4, c_a = 2.5: Gemma's four RMSNorms per layer, q/k norms,
gated GELU MLP and eager attention keep more than the textbook 16·h) were fitted to measured peaks on
the CPU by `tools/plan_vs_measured.py`. The margin covers XLA's own buffers. It is an estimate:
treat ±25 % as the expected error.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.hub import MODEL_SHAPES
from ..engine.logprobs import logit_chunk_rows
from ..engine.model_config import ModelConfig
from ..train.config import PRESETS, TPU_BOARDS

GIB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    """The architecture numbers the estimate needs. Gemma 2 and 3 have one shape for every layer; Gemma 4's layers
    differ by kind (`layer_types`: full-attention layers take `global_head_dim`), its last `kv_shared_layers` reuse
    earlier layers' keys and values (no k/v weights, no cache of their own; with `double_wide_mlp` their MLP is twice
    as wide), and every layer reads a per-layer embedding of each token (PLE: a `ple_vocab` × layers × `ple_dim`
    table, held on the device with the other weights)."""

    name: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool = True
    layer_types: tuple[str, ...] = ()
    """Each layer's kind ("sliding_attention" or "full_attention"); () = every layer alike."""
    global_head_dim: int | None = None
    """Full-attention layers' head size (Gemma 4); None = `head_dim`."""
    global_kv_heads: int | None = None
    """Full-attention layers' key/value heads where keys equal values (Gemma 4's `num_global_key_value_heads`)."""
    k_eq_v: bool = False
    """Full-attention layers use their keys as values (no v_proj)."""
    kv_shared_layers: int = 0
    """The last layers that reuse an earlier layer's keys and values."""
    double_wide_mlp: bool = False
    """The KV-shared layers' MLP is twice `intermediate` wide."""
    ple_dim: int = 0
    """Per-layer embedding width (Gemma 4's `hidden_size_per_layer_input`); 0 = none."""
    ple_vocab: int = 0
    """Rows of the per-layer embedding table."""

    @classmethod
    def from_config(cls, name: str, config: dict[str, Any]) -> ModelSpec:
        """From a Hugging Face config.json (a multimodal one's `text_config`)."""
        cfg = config.get("text_config", config)
        if cfg.get("enable_moe_block"):
            raise ValueError(f"{name}: a mixture-of-experts model, which the planner does not plan (dense models only)")
        heads = cfg["num_attention_heads"]
        ple_dim = cfg.get("hidden_size_per_layer_input") or 0
        # Google's Gemma 4 configs name the full layers' shapes; one transformers saved names them per layer
        full = next(iter((cfg.get("per_layer_config") or {}).values()), {})
        gemma4 = "global_head_dim" in cfg or "per_layer_config" in cfg
        return cls(name=name, vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                   heads=heads, kv_heads=cfg.get("num_key_value_heads", heads),
                   head_dim=cfg.get("head_dim", cfg["hidden_size"] // heads), intermediate=cfg["intermediate_size"],
                   tied=cfg.get("tie_word_embeddings", True),
                   layer_types=tuple(cfg.get("layer_types") or ()) if gemma4 else (),
                   global_head_dim=cfg.get("global_head_dim", full.get("head_dim")),
                   global_kv_heads=cfg.get("num_global_key_value_heads", full.get("num_key_value_heads")),
                   k_eq_v=bool(cfg.get("attention_k_eq_v")), kv_shared_layers=cfg.get("num_kv_shared_layers") or 0,
                   double_wide_mlp=bool(cfg.get("use_double_wide_mlp")), ple_dim=ple_dim,
                   ple_vocab=cfg.get("vocab_size_per_layer_input", cfg["vocab_size"]) if ple_dim else 0)

    def _full(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == "full_attention"

    def layer_head_dim(self, layer: int) -> int:
        return self.global_head_dim if self._full(layer) and self.global_head_dim else self.head_dim

    def layer_kv_heads(self, layer: int) -> int:
        """As transformers' Gemma4TextConfig: the global count applies to full layers only where keys equal values."""
        global_heads = self.global_kv_heads if self.k_eq_v else None
        return global_heads if self._full(layer) and global_heads else self.kv_heads

    def stores_kv(self, layer: int) -> bool:
        """Does the layer compute (and cache) keys and values of its own, or reuse an earlier layer's?"""
        return layer < self.layers - self.kv_shared_layers

    def layer_intermediate(self, layer: int) -> int:
        return self.intermediate * (2 if self.double_wide_mlp and not self.stores_kv(layer) else 1)

    def layer_shapes(self, layer: int) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection the layer has: q/k/v/o and the gated MLP's (k and v only where it stores its
        own keys and values; no v where keys are the values)."""
        d, kv, i = self.layer_head_dim(layer), self.layer_kv_heads(layer), self.layer_intermediate(layer)
        shapes = {"q_proj": (self.hidden, self.heads * d), "o_proj": (self.heads * d, self.hidden),
                  "gate_proj": (self.hidden, i), "up_proj": (self.hidden, i), "down_proj": (i, self.hidden)}
        if self.stores_kv(layer):
            shapes["k_proj"] = (self.hidden, kv * d)
            if not (self.k_eq_v and self._full(layer)):
                shapes["v_proj"] = (self.hidden, kv * d)
        return shapes

    def layer_params(self, layer: int) -> int:
        d = self.layer_head_dim(layer)
        norms = 4 * self.hidden + d + (d if self.stores_kv(layer) else 0)  # four RMSNorms, q_norm, k_norm
        ple = 2 * self.hidden * self.ple_dim + self.hidden if self.ple_dim else 0  # gate, projection, their norm
        return sum(a * b for a, b in self.layer_shapes(layer).values()) + norms + ple

    @property
    def ple_table_params(self) -> int:
        """The per-layer embedding table (Gemma 4's PLE; 0 without)."""
        return self.ple_vocab * self.layers * self.ple_dim

    @property
    def embedding_params(self) -> int:
        """The looked-up tables: the token embedding and, with PLE, the per-layer table (the LM head not counted)."""
        return self.vocab * self.hidden + self.ple_table_params

    @property
    def params(self) -> int:
        head = 0 if self.tied else self.vocab * self.hidden
        ple = self.hidden * self.layers * self.ple_dim + self.ple_dim if self.ple_dim else 0  # projection and norm
        return sum(self.layer_params(i) for i in range(self.layers)) + self.embedding_params + head + ple + self.hidden

    @property
    def kv_per_token(self) -> int:
        """Elements of keys and values one token leaves in the rollout's cache, over the layers that store them."""
        return sum(2 * self.layer_kv_heads(i) * self.layer_head_dim(i) for i in range(self.layers) if self.stores_kv(i))

    @property
    def qkv_elements(self) -> int:
        """Elements of the q, k and v weights the rollout stacks per layer (`decoder.Constants`)."""
        return sum(sum(a * b for name, (a, b) in self.layer_shapes(i).items() if name in ("q_proj", "k_proj", "v_proj"))
                   for i in range(self.layers))

    @property
    def intermediate_total(self) -> int:
        """Σ over layers of the MLP's width."""
        return sum(self.layer_intermediate(i) for i in range(self.layers))

    def lora_params(self, r: int, targets: tuple[str, ...]) -> int:
        return sum(r * (a + b) for i in range(self.layers) for name, (a, b) in self.layer_shapes(i).items()
                   if name in targets)


MODELS: dict[str, ModelSpec] = {
    path.parent.name: ModelSpec.from_config(path.parent.name, json.loads(path.read_text()))
    for path in sorted(MODEL_SHAPES.glob("*/config.json"))
}
"""Known models, read from each one's config.json under `assets/models/` (the `google/` prefix and `-it`/base
suffix are optional when looking one up)."""


@dataclass(frozen=True)
class Accelerator:
    name: str
    devices: int
    gib_per_device: float
    bf16: bool = True
    family: str = ""
    """The chip (v5e, v6e, t4, cpu, …): what `scaling.SPEEDS` knows it by."""

    @property
    def tpu(self) -> bool:
        return self.family.startswith("v")


ACCELERATORS: dict[str, Accelerator] = {
    **{board: Accelerator(f"TPU {board}", n, gib, family=board.split("-")[0])
       for board, (n, gib) in TPU_BOARDS.items()},
    "t4": Accelerator("GPU T4", 1, 15.0, bf16=False, family="t4"),
    "cpu": Accelerator("CPU (24 GiB)", 1, 24.0, bf16=False, family="cpu"),
}
"""The boards with a preset, a T4 and this kit's CPU. `accelerator` also reads `<one of these>-x<N>` (N of its
devices: t4-x2 is Kaggle's "GPU T4 × 2", cpu-x2 two processes on one host) and a bigger slice of a TPU family
(v5e-16, v5e-32: chips of the family's one-chip board)."""

ACTIVATION_COEFFS = {"hidden": 22.0, "intermediate": 4.0, "scores": 2.5}
XLA_MARGIN = 0.10


def model_spec(name: str) -> ModelSpec:
    """A known model by name (e.g. `google/gemma-3-1b-it`), or a local HF directory's config.json."""
    path = Path(name)
    if (path / "config.json").exists():
        return ModelSpec.from_config(path.name, json.loads((path / "config.json").read_text()))
    key = name.split("/")[-1].lower().removesuffix("-offline")  # gemma-3-270m-offline: the PyPI copy, same shapes
    for candidate in (key, key.removesuffix("-it"), key + "-it", key.removesuffix("-pt") + "-it"):
        if candidate in MODELS:
            return MODELS[candidate]
    raise ValueError(f"unknown model {name!r}: known {sorted(MODELS)}, or pass a directory holding config.json")


def accelerator(name: str) -> Accelerator:
    key = name.lower().removeprefix("tpu-").removeprefix("tpu ")
    if key in ACCELERATORS:
        return ACCELERATORS[key]
    base, _, count = key.rpartition("-x") if "-x" in key else key.rpartition("-")
    one = ACCELERATORS.get(base if "-x" in key else f"{base}-1")
    if one is None or not count.isdigit() or int(count) < 1:
        raise ValueError(f"unknown accelerator {name!r}; known: {sorted(ACCELERATORS)}, any of them as <name>-x<N> "
                         "for N devices (t4-x2), or a TPU slice of a known family (v5e-16)")
    n = int(count)
    label = f"{one.name} × {n}" if "-x" in key else f"TPU {key}"
    return dataclasses.replace(one, name=label, devices=n)


TPU_RECIPE: dict[str, Any] = PRESETS["tpu-v2-8-gemma-3-1b"]
"""The recipe every TPU preset shares (prompts per step, group size, completion length, β, LoRA rank): what a plan
assumes unless told otherwise."""


@dataclass
class PlanInput:
    """What a plan is for; every field is also a `grpo-kit plan` flag of the same name (its default the same)."""

    model: str = "gemma-3-1b-it"
    """gemma-3-270m, gemma-3-1b-it, gemma-2-2b-it, gemma-4-e2b-it, gemma-4-e4b-it, tiny-gemma or a directory with
    config.json"""
    tpu: str = "v2-8"
    """v2-8, v3-8, v5e-1, v5e-8, v6e-1, v6e-8, a bigger slice (v5e-16), t4, cpu, or any as <name>-x<N> for N devices
    (t4-x2)"""
    lora: bool = True
    """LoRA (False: full fine-tuning)"""
    lora_r: int = ModelConfig.lora_r
    """LoRA rank (ModelConfig.lora_r)"""
    lora_targets: tuple[str, ...] = ModelConfig.lora_target_modules
    """the modules LoRA adapts (ModelConfig.lora_target_modules)"""
    prompts_per_step: int = TPU_RECIPE["grpo"]["prompts_per_step"]
    """GRPOConfig.prompts_per_step, as in the TPU presets"""
    group_size: int = TPU_RECIPE["grpo"]["group_size"]
    """GRPOConfig.group_size, as in the TPU presets"""
    prompt_length: int = 128
    """prompt tokens after the chat template (a GSM8K question with the instruction: about 120)"""
    max_new_tokens: int = TPU_RECIPE["grpo"]["max_new_tokens"]
    """GRPOConfig.max_new_tokens, as in the TPU presets"""
    micro_batch_size: int | None = None
    """GRPOConfig.micro_batch_size; None = the planner picks the largest that fits"""
    gradient_checkpointing: bool | None = None
    """ModelConfig.gradient_checkpointing; None = the planner turns it on only when needed"""
    beta: float = TPU_RECIPE["grpo"]["beta"]
    """GRPOConfig.beta, as in the TPU presets (> 0 keeps a reference copy under full fine-tuning)"""
    dtype_bytes: int | None = None
    """bytes per weight element; None = 2 (bf16) on bf16 hardware, else 4"""
    ple_on_host: bool = False
    """Gemma 4's per-layer embedding table kept in host memory (ModelConfig.ple_on_host; GPUs only)"""


def estimate(p: PlanInput, micro_batch: int, checkpointing: bool) -> dict[str, float]:
    """Per-device bytes by component for one configuration (see the module docstring)."""
    spec, acc = model_spec(p.model), accelerator(p.tpu)
    n = acc.devices
    b = p.dtype_bytes or (2 if acc.bf16 else 4)
    total_params = spec.params
    trainable = spec.lora_params(p.lora_r, p.lora_targets) if p.lora else total_params
    shard = 1 if p.lora else n
    seq = p.prompt_length + p.max_new_tokens
    rows = max(1, math.ceil(micro_batch / n))
    rollout_rows = max(1, math.ceil(p.prompts_per_step * p.group_size / n))
    c = ACTIVATION_COEFFS
    per_token_layers = (spec.layers * (c["hidden"] * spec.hidden + c["scores"] * spec.heads * seq)
                        + c["intermediate"] * spec.intermediate_total)  # Σ over layers
    ple_inputs = spec.layers * spec.ple_dim * 2  # each token's per-layer inputs, looked up and projected (Gemma 4)
    if checkpointing:
        activations = rows * seq * b * (spec.layers * spec.hidden + per_token_layers / spec.layers + ple_inputs)
    else:
        activations = rows * seq * (per_token_layers + ple_inputs) * b
    on_device = total_params - (spec.ple_table_params if p.ple_on_host else 0)
    out = {
        "weights": on_device * b / shard,
        "trainable_fp32": trainable * 4 if p.lora else 0.0,
        "gradients": trainable * (4 if p.lora else b) / shard,
        "optimizer": trainable * 2 * (4 if p.lora else b) / shard,
        "fsdp_gathered_layer": 0.0
        if p.lora or n == 1
        else 2 * (total_params - spec.embedding_params) / spec.layers * b,
        "reference": (total_params * b / n) if (not p.lora and p.beta > 0) else 0.0,
        "activations": activations,
        "logits": min(logit_chunk_rows(p.max_new_tokens, spec.vocab), rows) * p.max_new_tokens * spec.vocab * 4 * 6,
        "kv_cache": rollout_rows * seq * spec.kv_per_token * b,
        "rollout_logits": rollout_rows * spec.vocab * 4 * 3,
        "prefill_transient": rollout_rows
        * p.prompt_length
        * (4 * spec.hidden + 3 * max(spec.layer_intermediate(i) for i in range(spec.layers)) + 2 * spec.heads * seq)
        * b,
        "qkv_stacked": spec.qkv_elements * b,
        # torchrun's processes sample on whole weights: the shards of the others gathered (`engine.sharding`)
        "rollout_gathered_weights": on_device * b * (1 - 1 / n) if (not p.lora and n > 1 and not acc.tpu) else 0.0,
    }
    persistent = sum(
        out[k] for k in ("weights", "trainable_fp32", "gradients", "optimizer", "reference", "fsdp_gathered_layer"))
    out["training_phase"] = out["activations"] + out["logits"]
    out["rollout_phase"] = (out["kv_cache"] + out["rollout_logits"] + out["prefill_transient"] + out["qkv_stacked"]
                            + out["rollout_gathered_weights"])
    peak = persistent + max(out["training_phase"], out["rollout_phase"])
    out["margin"] = XLA_MARGIN * peak
    out["total"] = peak + out["margin"]
    return out


def plan(p: PlanInput) -> dict[str, Any]:
    """Pick micro-batch and checkpointing that fit; report the estimate, or refuse with what to change."""
    acc, spec = accelerator(p.tpu), model_spec(p.model)
    n = acc.devices
    budget = acc.gib_per_device * GIB
    rows = p.prompts_per_step * p.group_size
    if rows % n:
        raise ValueError(f"prompts_per_step × group_size = {rows} rows cannot be split over {n} devices of {acc.name}: "
                         f"make it a multiple of {n}")
    sizes = (
        [p.micro_batch_size]
        if p.micro_batch_size
        else [m for m in (rows, 64, 32, 16, 8, 4, 2, 1) if m <= rows and rows % m == 0 and m % n == 0]
    )
    sizes = sorted(set(sizes), reverse=True) or [n]
    ckpt_options = [p.gradient_checkpointing] if p.gradient_checkpointing is not None else [False, True]
    tried = []
    for ckpt in ckpt_options:
        for m in sizes:
            est = estimate(p, m, ckpt)
            tried.append((m, ckpt, est["total"]))
            if est["total"] <= budget:
                return _report(p, spec=spec, acc=acc, micro=m, ckpt=ckpt, est=est, fits=True)
    m, ckpt, _ = min(tried, key=lambda t: t[2])
    report = _report(p, spec=spec, acc=acc, micro=m, ckpt=ckpt, est=estimate(p, m, ckpt), fits=False)
    report["advice"] = _advice(p, report)
    return report


def _report(
    p: PlanInput, *, spec: ModelSpec, acc: Accelerator, micro: int, ckpt: bool, est: dict, fits: bool
) -> dict[str, Any]:
    return {
        "model": spec.name, "accelerator": acc.name, "devices": acc.devices, "gib_per_device": acc.gib_per_device,
        "params": spec.params, "lora": p.lora, "fits": fits, "micro_batch_size": micro,
        "gradient_checkpointing": ckpt, "estimate_gib": {k: round(v / GIB, 3) for k, v in est.items()},
        "inputs": dataclasses.asdict(p),
    }


def _advice(p: PlanInput, report: dict) -> str:
    est = report["estimate_gib"]
    biggest = sorted((v, k) for k, v in est.items() if k not in ("total", "margin", "training_phase", "rollout_phase"))[
        -2:]
    hints = []
    if not p.lora:
        hints.append("use LoRA (lora=True): base weights are then frozen, with no gradients or optimizer state")
    if est["kv_cache"] + est["rollout_logits"] > 0.25 * est["total"]:
        hints.append("sample fewer rows at once (prompts_per_step or group_size) or a shorter max_new_tokens")
    if est["activations"] > 0.25 * est["total"]:
        hints.append("a shorter max_new_tokens / prompt_length")
    spec = model_spec(p.model)
    if spec.ple_table_params and not p.ple_on_host and not p.tpu.startswith("v"):
        hints.append(f"keep the per-layer embedding table on the host (--ple-on-host: "
                     f"{spec.ple_table_params * (p.dtype_bytes or 4) / GIB:.1f} GiB less on the GPU)")
    hints.append("a bigger accelerator (v3-8 / v5e-8 have 16 GiB per device)")
    return (f"{report['model']} needs ≈ {est['total']:.1f} GiB per device even with micro-batch "
            f"{report['micro_batch_size']} and gradient checkpointing, but {report['accelerator']} has "
            f"{report['gib_per_device']:.0f} GiB; the largest parts are {biggest[1][1]} ({biggest[1][0]:.1f} GiB) "
            f"and {biggest[0][1]} ({biggest[0][0]:.1f} GiB). Try: " + "; ".join(hints) + ".")


def table(models: tuple[str, ...] = ("gemma-3-270m", "gemma-3-1b-it", "gemma-2-2b-it"),
          tpus: tuple[str, ...] = ("v2-8", "v3-8", "v5e-1", "v5e-8", "v6e-1", "v6e-8"), **kwargs: Any) -> str:
    """The README's markdown table: what fits where, with which settings."""
    lines = ["| model | " + " | ".join(f"TPU {t}" for t in tpus) + " |", "|---|" + "---|" * len(tpus)]
    for model in models:
        cells = []
        for tpu in tpus:
            parts = []
            for lora in (True, False):
                r = plan(PlanInput(model=model, tpu=tpu, lora=lora, **kwargs))
                kind = "LoRA" if lora else "full"
                if r["fits"]:
                    parts.append(
                        f"{kind}: micro {r['micro_batch_size']}{', ckpt' if r['gradient_checkpointing'] else ''}"
                        f" ({r['estimate_gib']['total']:.1f} GiB)"
                    )
                else:
                    parts.append(f"{kind}: no ({r['estimate_gib']['total']:.1f} GiB)")
            cells.append("<br>".join(parts))
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
