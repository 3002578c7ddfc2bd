"""Export a trained model as a plain transformers directory: LoRA merged into the weights, safetensors,
the tokenizer with Gemma's chat template, stop tokens in the generation config, and a short model card.
Optionally pushed to the Hugging Face Hub.

The directory loads with nothing but transformers:

    model = AutoModelForCausalLM.from_pretrained(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)   # apply_chat_template works
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from .chat import ensure_chat_template, stop_token_ids
from .models import base_model, is_lora


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A CPU copy of `model` with any LoRA adapter merged into its weights (the trained model is left as is)."""
    clone = copy.deepcopy(model).to("cpu")
    if is_lora(clone):
        clone = clone.merge_and_unload()
    clone.tie_weights()  # moving between devices can untie Gemma's embeddings and lm_head
    return clone.eval()


def model_card(base: str, metrics: dict[str, Any] | None = None, notes: str = "") -> str:
    """A short README.md for the exported directory."""
    lines = [
        "---",
        f"base_model: {base}",
        "library_name: transformers",
        "tags: [gemma, grpo, grpo_kit]",
        "license: gemma",
        "---",
        "",
        f"# {base}, fine-tuned with GRPO (grpo_kit)",
        "",
        f"Fine-tuned from `{base}` with grpo_kit: supervised warm-up, then Group Relative Policy Optimization "
        "against programmatic rewards. LoRA adapters (if any) are merged into these weights.",
        "",
        "Use with transformers; the tokenizer carries Gemma's chat template, and generation stops at "
        "`<eos>` or `<end_of_turn>`:",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(PATH)",
        "model = AutoModelForCausalLM.from_pretrained(PATH)",
        "ids = tok.apply_chat_template([{'role': 'user', 'content': 'What is 47 + 38?'}], add_generation_prompt=True, return_tensors='pt')",
        "print(tok.decode(model.generate(ids, max_new_tokens=64)[0, ids.shape[1]:]))",
        "```",
        "",
        "Gemma is provided under the Gemma Terms of Use (https://ai.google.dev/gemma/terms); so are derivatives.",
    ]
    if metrics:
        lines += ["", "## Results", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in metrics.items()]
    if notes:
        lines += ["", notes]
    return "\n".join(lines) + "\n"


def export_model(
    model: torch.nn.Module,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    base_name: str | None = None,
    metrics: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
    push_to: str | None = None,
    token: str | None = None,
    private: bool = True,
) -> Path:
    """Merge, save (safetensors + tokenizer + chat template + generation config + README.md) to `out_dir`,
    and push to the Hub repo `push_to` when given. `dtype` (e.g. torch.bfloat16) halves the files; the
    default keeps the training dtype, so reloading gives the same logits."""
    base = base_name or getattr(base_model(model).config, "_name_or_path", "") or "gemma"
    out = save_merged(merged_copy(model), tokenizer, out_dir, base_name=str(base), metrics=metrics, dtype=dtype)
    if push_to:
        push_folder(out, push_to, token=token, private=private)
    return out


def save_merged(
    merged: torch.nn.Module,
    tokenizer: Any,
    out_dir: str | Path,
    *,
    base_name: str,
    metrics: dict[str, Any] | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write an already-merged model (from `merged_copy`) as `export_model` does, without pushing."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if dtype is not None:
        merged = merged.to(dtype)
    tokenizer = ensure_chat_template(tokenizer)
    merged.generation_config.eos_token_id = stop_token_ids(tokenizer)
    merged.generation_config.pad_token_id = tokenizer.pad_token_id
    merged.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "README.md").write_text(model_card(base_name, metrics))
    if metrics:
        (out / "grpo_kit_metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
    return out


def push_folder(folder: str | Path, repo_id: str, token: str | None = None, private: bool = True) -> str:
    """Upload an exported directory to the Hub (creating the repo); failures explained. Returns the repo URL."""
    from huggingface_hub import HfApi

    from .hub import ModelAccessError, explain_hub_error, hf_token

    token = hf_token(token)
    if token is None:
        raise ModelAccessError(f"pushing to {repo_id} needs a Hugging Face token with write access: set HF_TOKEN "
                               "(Colab: a secret) — https://huggingface.co/settings/tokens")
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message="grpo_kit export")
    except Exception as e:  # noqa: BLE001 - every failure becomes one message with its fix
        raise ModelAccessError(f"push to {repo_id} failed: {explain_hub_error(e, repo_id, token)}") from e
    return str(url)
