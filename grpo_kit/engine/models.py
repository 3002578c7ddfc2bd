"""Models: the embedded tiny Gemma, real Gemma checkpoints, LoRA, and the reference policy.

The tiny Gemma is transformers' own `Gemma3ForCausalLM` built from a small config, with a character-level
tokenizer that carries Gemma's special tokens and Gemma's chat template. Its config and tokenizer files
live in `grpo_kit/assets/models/tiny-gemma/` (the tokenizer written by `scripts/make_tiny_gemma.py`); weights start from
a seed.
"""

from __future__ import annotations

import contextlib
import copy
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from ..data.answer_format import TAGS
from ..data.chat import GEMMA4_CHAT_TEMPLATE, GEMMA4_TOKENS, GEMMA_CHAT_TEMPLATE, ensure_chat_template
from . import sharding
from .device import enable_activation_checkpointing, is_xla, move_model, resolve_dtype, seeded_cpu_rng, shard_parameters
from .distributed import launched_size, world
from .hub import MODEL_SHAPES, TINY_MODELS, resolve_model
from .model_config import ModelConfig

# Gemma's special token ids for pad/eos/bos/unk are 0/1/2/3; the tiny tokenizer keeps them, then its turn tokens:
# Gemma 2/3's for the tiny Gemma, Gemma 4's for the tiny Gemma 4 (whose turn end is id 5 too).
TINY_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
TINY_SPECIAL_4 = ["<pad>", "<eos>", "<bos>", "<unk>", *GEMMA4_TOKENS]
# The answer-format tags are single tokens in the tiny vocabulary: shorter sequences, faster CPU demos.
TINY_TAGS = list(TAGS)
TINY_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))

TINY_CONFIGS: dict[str, dict[str, Any]] = {
    name: json.loads((MODEL_SHAPES / name / "config.json").read_text()) for name in TINY_MODELS}
TINY_CONFIG = TINY_CONFIGS["tiny-gemma"]


def build_tiny_tokenizer(gemma4: bool = False) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per printable ASCII character and newline, Gemma's special
    tokens at Gemma's ids, the answer-format tags as single tokens, and Gemma's chat template — with `gemma4`,
    Gemma 4's turn and thinking tokens and its chat template (the tiny Gemma 4's)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    special = TINY_SPECIAL_4 if gemma4 else TINY_SPECIAL
    vocab = {tok: i for i, tok in enumerate(special + TINY_TAGS)}
    for ch in TINY_CHARS:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in TINY_TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=special[4:],
        chat_template=GEMMA4_CHAT_TEMPLATE if gemma4 else GEMMA_CHAT_TEMPLATE,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=TINY_CONFIG["max_position_embeddings"],
    )


def write_tiny_gemma_files(out_dir: str | Path, name: str = "tiny-gemma") -> Path:
    """Write an embedded model's config.json and tokenizer files (no weights: they come from a seed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer, config = build_tiny_tokenizer(gemma4=name == "tiny-gemma-4"), TINY_CONFIGS[name]
    if len(tokenizer) > config["vocab_size"]:
        raise AssertionError(f"{name}: tiny vocabulary {len(tokenizer)} exceeds vocab_size {config['vocab_size']}")
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return out


def tiny_gemma_dir(name: str = "tiny-gemma") -> Path:
    """An embedded model's config and tokenizer, shipped inside the package."""
    return MODEL_SHAPES / name


def _attn_impl(device: torch.device, tiny: bool) -> str:
    # sdpa adds host syncs inside every step on XLA; tiny models gain nothing from it either.
    return "eager" if tiny or is_xla(device) else "sdpa"


def load_tokenizer(name: str, token: str | None = None) -> Any:
    """The tokenizer for a model name (see `hub.resolve_model`), with Gemma's chat template when it has none."""
    path = resolve_model(name, token).path
    if path in TINY_MODELS:
        return AutoTokenizer.from_pretrained(tiny_gemma_dir(path))
    return ensure_chat_template(AutoTokenizer.from_pretrained(path))


def load_model(cfg: ModelConfig, device: torch.device) -> tuple[torch.nn.Module, Any]:
    """Load (model, tokenizer) for `cfg.name`, move it to `device` with embeddings re-tied, and wrap it in
    a LoRA adapter when asked. Initialisation happens on the CPU (XLA's random init differs)."""
    resolved = resolve_model(cfg.name, cfg.hf_token)
    if resolved.note:
        warnings.warn(f"{cfg.name}: {resolved.note}", stacklevel=2)
    tiny = resolved.path in TINY_MODELS
    dtype = resolve_dtype(cfg.dtype, device)
    tokenizer = load_tokenizer(resolved.path)
    if tiny:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(MODEL_SHAPES / resolved.path)
        config._attn_implementation = "eager"
        with seeded_cpu_rng(cfg.seed):
            model = AutoModelForCausalLM.from_config(config)
    else:
        model = from_pretrained_text(resolved.path, attn_implementation=_attn_impl(device, tiny))
    use_lora = (not tiny) if cfg.lora is None else cfg.lora
    if use_lora:
        model = add_lora(model, cfg)
    if cfg.gradient_checkpointing:
        enable_activation_checkpointing(model, device)
        if use_lora:
            model.enable_input_require_grads()
    with _ple_kept_on_host(model, device, keep=cfg.ple_on_host):
        model = move_model(model, device, dtype)
    shard_parameters(model)  # FSDP-style under SPMD with full fine-tuning; a no-op otherwise
    _shard_over_processes(model, cfg, device)
    return model, tokenizer


def _shard_over_processes(model: torch.nn.Module, cfg: ModelConfig, device: torch.device) -> None:
    """Under torchrun, full fine-tuning's weights sharded over the processes (`ModelConfig.shard_weights`)."""
    if launched_size() <= 1:
        return
    processes = world(device)
    if sharding.wanted(model, processes, setting=cfg.shard_weights):
        if cfg.ple_on_host:
            raise ValueError("ModelConfig.ple_on_host with weights sharded over processes: the table would be sharded "
                             "too; use LoRA, or shard_weights: false")
        sharding.shard(model, sharding.mesh(processes, device))


def random_model(name: str, *, layers: int, kv_shared_layers: int = 0, seed: int = 0,
                 **overrides: Any) -> torch.nn.Module:
    """transformers' model for a known config (`assets/models/<name>/config.json`: its hidden size, heads, head
    sizes, MLP and per-layer-embedding widths, vocabulary) with `layers` layers alternating sliding and full
    attention (the last full, as Gemma 4 requires), the last `kv_shared_layers` of them reusing earlier keys and
    values (Gemma 4), random weights from `seed`, eager attention: a model of a real model's shapes for benchmarks
    and tests, no download. `overrides` replace config fields (`vocab_size` also sets Gemma 4's
    `vocab_size_per_layer_input`)."""
    from transformers import AutoConfig

    fields = json.loads((MODEL_SHAPES / name / "config.json").read_text())
    fields.pop("per_layer_config", None)  # rebuilt by transformers for the new layer list
    kinds = ["sliding_attention" if (layers - i) % 2 == 0 else "full_attention" for i in range(layers)]
    fields.update(num_hidden_layers=layers, architectures=None, layer_types=kinds)
    if "num_kv_shared_layers" in fields or kv_shared_layers:
        fields["num_kv_shared_layers"] = kv_shared_layers
    if "vocab_size" in overrides and "vocab_size_per_layer_input" in fields:
        fields["vocab_size_per_layer_input"] = overrides["vocab_size"]
    fields.update(overrides)
    config = AutoConfig.for_model(**{k: v for k, v in fields.items() if v is not None})
    config._attn_implementation = "eager"
    with seeded_cpu_rng(seed):
        return AutoModelForCausalLM.from_config(config).eval()


@contextlib.contextmanager
def _ple_kept_on_host(model: torch.nn.Module, device: torch.device, *, keep: bool) -> Iterator[None]:
    """With `keep`, Gemma 4's per-layer embedding table sits out of the move inside the block and is looked up on the
    host after it (`ModelConfig.ple_on_host`); otherwise the block runs as it is."""
    hf = base_model(model)
    table = getattr(getattr(hf, "model", None), "embed_tokens_per_layer", None)
    if not keep or table is None:
        yield
        return
    if is_xla(device):
        raise ValueError("ModelConfig(ple_on_host=True) is for GPUs and the CPU: a TPU's compiled steps cannot stop "
                         "for a host lookup (its preset keeps the table in HBM)")
    hf.model.embed_tokens_per_layer = None
    try:
        yield
    finally:
        hf.model.embed_tokens_per_layer = table
    keep_ple_on_host(hf)


def keep_ple_on_host(hf: torch.nn.Module) -> None:
    """Look Gemma 4's per-layer embeddings up where their table is (the host) and send the rows, in the dtype of the
    model's token embedding, to where that embedding is: hooks on the table's module, so the model's own forward,
    `generate` and the kit's forwards all go through them, and the weights keep their names for saving and export."""
    table, embed = hf.model.embed_tokens_per_layer, hf.model.embed_tokens
    table.requires_grad_(False)
    table.register_forward_pre_hook(lambda module, args: (args[0].to(module.weight.device),))
    table.register_forward_hook(lambda module, args, rows: rows.to(embed.weight.device, embed.weight.dtype))


GEMMA4_TEXT_KEYS = {r"^model\.language_model\.": "model."}
"""Where a multimodal Gemma 4 checkpoint keeps its text decoder, and where `Gemma4ForCausalLM` expects it."""


def from_pretrained_text(path: str, *, attn_implementation: str) -> torch.nn.Module:
    """The causal LM in a transformers directory, in fp32. A multimodal Gemma 4 checkpoint (Google's E2B and E4B hold
    vision and audio towers) gives its text decoder alone as `Gemma4ForCausalLM`: the towers are never built or
    kept in memory. Raises, naming them, if any of the decoder's weights were not in the checkpoint."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    if config.model_type != "gemma4":
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)
    from transformers import Gemma4ForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the towers' weights are left out on purpose: no report of them
    try:
        model, info = Gemma4ForCausalLM.from_pretrained(
            path, config=config.text_config, dtype=torch.float32, attn_implementation=attn_implementation,
            key_mapping=GEMMA4_TEXT_KEYS, output_loading_info=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    missing = [k for k in info["missing_keys"] if k != "lm_head.weight" or not config.text_config.tie_word_embeddings]
    if missing:
        raise ValueError(f"{path}: its Gemma 4 text decoder lacks {len(missing)} weights, e.g. {missing[:3]}")
    return model


def add_lora(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
    """Wrap `model` in a peft LoRA adapter (created on the CPU, before any move). Its random A matrices come from
    `cfg.seed`, so that a seeded run is the same run in every process; the process's own random state is left
    as it was."""
    from peft import LoraConfig, get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [m for m in cfg.lora_target_modules if m in present]
    if not targets:
        raise ValueError(f"none of lora_target_modules {cfg.lora_target_modules} exist in {type(model).__name__}")
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=targets, task_type="CAUSAL_LM")
    with seeded_cpu_rng(cfg.seed):
        return get_peft_model(model, lora)


def merge_and_restart_lora(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
    """Fold a trained LoRA adapter into the base weights and put a fresh adapter (B = 0: the same function) on
    top. A GRPO run after LoRA SFT starts like this, so that its reference policy — the model with the adapter
    off — is the SFT model and not the base model from before SFT. A model without an adapter is returned as it
    is: under full fine-tuning the reference is a copy of the weights GRPO starts from already."""
    if not is_lora(model):
        return model
    device = next(model.parameters()).device
    merged = model.merge_and_unload()
    fresh = add_lora(merged, cfg)
    if cfg.gradient_checkpointing:
        fresh.enable_input_require_grads()
    return move_model(fresh, device, resolve_dtype(cfg.dtype, device))


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "peft_config")


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The transformers model under a peft wrapper (or the model itself)."""
    return model.get_base_model() if is_lora(model) else model


class ReferencePolicy:
    """π_ref for the KL term: the same model with the LoRA adapter disabled (no second copy), or a frozen copy of
    the initial weights under full fine-tuning (sharded as the policy is, `sharding`). Optional EMA:
    ref ← (1 − α)·ref + α·policy."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.policy = model
        self.frozen: torch.nn.Module | None = None
        if sharding.is_sharded(model):
            self.frozen = sharding.frozen_copy(model)
        elif not is_lora(model):
            self.frozen = copy.deepcopy(model).eval()
            self.frozen.requires_grad_(False)
            move_model(self.frozen, next(model.parameters()).device)

    @contextlib.contextmanager
    def model(self) -> Iterator[torch.nn.Module]:
        """Yields the module whose forward is π_ref."""
        if self.frozen is not None:
            yield self.frozen
        else:
            with self.policy.disable_adapter():
                yield self.policy

    @torch.no_grad()
    def ema_update(self, alpha: float) -> None:
        if self.frozen is None:
            raise ValueError("EMA reference updates need full fine-tuning (under LoRA the reference is the base model)")
        if sharding.is_sharded(self.frozen):
            sharding.lerp_shards(self.frozen, self.policy, alpha)
            return
        for ref_p, p in zip(self.frozen.parameters(), self.policy.parameters(), strict=True):
            ref_p.lerp_(p.detach(), alpha)


def count_parameters(model: torch.nn.Module) -> dict[str, int]:
    unique = {id(p): p for p in model.parameters()}.values()
    return {"total": sum(p.numel() for p in unique), "trainable": sum(p.numel() for p in unique if p.requires_grad)}

