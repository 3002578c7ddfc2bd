"""`ModelConfig`: which model to load and how to adapt it (LoRA, dtype, gradient checkpointing).

It lives with the engine, which loads models, so that loading never imports the trainers' settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import options
from ..validation import above, at_least, one_of, ruled, validate, within


@dataclass
class ModelConfig:
    """Which model to train and how to adapt it."""

    name: str = "tiny-gemma"
    """`tiny-gemma` (embedded, ~1M params, character vocabulary), `tiny-gemma-4` (a tiny random Gemma 4, the same
    tokenizer), a local Hugging Face directory, or a hub id such as `google/gemma-3-1b-it`. Default tiny-gemma: it
    trains in minutes on a laptop CPU."""
    seed: int = ruled(0, within(0, 2**32 - 1))
    """Seed for the random initialisation: the tiny model's weights, and a LoRA adapter's A matrices (also the
    fresh adapter put on the SFT model before GRPO and its controls). A real checkpoint's weights ignore it."""
    lora: bool | None = None
    """Train a LoRA adapter instead of all weights. None = automatic: LoRA for real Gemma (memory),
    full fine-tuning for tiny-gemma (it is small and LoRA would slow its learning)."""
    lora_r: int = ruled(8, at_least(1))
    """LoRA rank. 8 is the common default: enough for format and arithmetic skills."""
    lora_alpha: int = ruled(16, above(0))
    """LoRA scaling numerator (alpha / r scales the update). 2 × r is the usual choice."""
    lora_dropout: float = ruled(0.0, within(0, 1, high_open=True))
    """0 by default: dropout makes the policy and reference disagree and inflates KL (trl#3500)."""
    lora_target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    """Attention and MLP projections, as Unsloth and TRL examples use for Gemma."""
    dtype: str = ruled("auto", one_of(options.MODEL_DTYPES))
    """`auto` = bfloat16 on TPU/GPU, float32 on CPU (this CPU has no fast bf16). Gemma must not train in
    float16 (it overflows, unsloth-zoo#600)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory, more time (a second forward). Off for tiny models."""
    ple_on_host: bool = False
    """Gemma 4 on a GPU: keep the per-layer embedding table (E2B: 2.35B of its 4.63B weights) in host memory in the
    checkpoint's dtype, look each forward's tokens up there and send their rows to the GPU (`models.keep_ple_on_host`):
    E2B then fits a T4's 15 GiB in float32 (`grpo-kit plan --ple-on-host`). The table is frozen; the rows are cast
    after the lookup, and its scale (√256 = 16 on E2B and E4B) is exact in any dtype, so the numbers are the GPU's.
    Ignored for models without the table; refused on a TPU, whose compiled steps cannot stop for a host lookup."""
    shard_weights: bool | None = None
    """Under torchrun with full fine-tuning: each process holds 1/N of the weights, gradients and AdamW moments
    (FSDP2, `engine.sharding`), what lets a model that does not fit one GPU train on several (Gemma 3 1B on Kaggle's
    T4 × 2). None = shard whenever full fine-tuning runs on several processes; False keeps a whole copy per process
    (the update then runs the kit's own forward, faster, where it fits). LoRA is never sharded."""
    hf_token: str | None = field(default=None, repr=False)
    """Hugging Face token for gated Gemma checkpoints; None reads HF_TOKEN or the Colab secret."""

    def __post_init__(self) -> None:
        validate(self)
