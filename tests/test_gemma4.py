"""Gemma 4 in the kit: the tiny random Gemma 4 (per-layer embeddings, layers that reuse earlier keys and values, keys
as values on full-attention layers, both layer kinds) loaded, adapted with LoRA, trained by SFT and GRPO, sampled,
exported and reloaded; its names and licence. No Gemma 4 weights reach this machine: everything runs on random
weights of the shipped configs."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpo_kit.data.chat import GEMMA4_TOKENS, decode_completions, stop_token_ids
from grpo_kit.data.rewards import correctness_reward, make_length_penalty, soft_format_reward, strict_format_reward
from grpo_kit.data.tasks import ArithmeticTask
from grpo_kit.engine import sampling
from grpo_kit.engine.hub import ALIASES, MODEL_SHAPES, resolve_model
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import base_model, build_tiny_tokenizer, count_parameters, load_model, load_tokenizer
from grpo_kit.engine.sampling import SamplerSettings, encode_prompts, sample
from grpo_kit.eval.export import export_model, model_card
from grpo_kit.eval.planner import MODELS, model_spec
from grpo_kit.train.config import GRPOConfig, SFTConfig
from grpo_kit.train.grpo import GRPOTrainer
from grpo_kit.train.sft import SFTTrainer, encode_demonstrations

PROMPTS = ["What is 12 + 7?", "What is 3 * 4?"]


def tiny_gemma4(lora: bool = False, seed: int = 0) -> tuple[torch.nn.Module, object]:
    return load_model(ModelConfig(name="tiny-gemma-4", lora=lora, seed=seed), torch.device("cpu"))


def test_the_tiny_gemma4_has_every_layer_feature_of_gemma4():
    """Built from assets/models/tiny-gemma-4/config.json with the tiny tokenizer, no download: both layer kinds with
    their own head sizes, per-layer embeddings, the last layers reusing keys and values (no k/v of their own, a
    double-wide MLP), full-attention layers using keys as values; the planner counts it exactly."""
    model, tokenizer = tiny_gemma4()
    assert resolve_model("tiny-gemma-4").source == "embedded"
    assert type(model).__name__ == "Gemma4ForCausalLM" and tokenizer.pad_token_id == 0
    assert tokenizer.convert_ids_to_tokens(5) == "<turn|>" and 5 in model.config.eos_token_id
    layers = model.model.layers
    kinds = [layer.self_attn.layer_type for layer in layers]
    assert set(kinds) == {"sliding_attention", "full_attention"}
    assert {layer.self_attn.head_dim for layer in layers} == {16, 32}
    shared = [layer.self_attn.is_kv_shared_layer for layer in layers]
    assert any(shared) and not shared[0] and not any(hasattr(layers[i].self_attn, "k_proj") for i, s in
                                                     enumerate(shared) if s)
    assert any(layer.self_attn.v_proj is None for layer, s in zip(layers, shared, strict=True)
               if not s and layer.self_attn.layer_type == "full_attention")  # keys are the values there
    assert model.model.embed_tokens_per_layer.weight.shape == (112, 6 * 16)
    assert {layer.mlp.intermediate_size for layer, s in zip(layers, shared, strict=True) if s} == {256}
    assert MODELS["tiny-gemma-4"].params == count_parameters(model)["total"]


def test_the_gemma4_names_resolve_to_their_hub_ids():
    assert ALIASES["gemma-4-e2b-it"] == "google/gemma-4-E2B-it" and ALIASES["gemma-4-e4b"] == "google/gemma-4-E4B"


def _logits(model: torch.nn.Module, tokenizer: object) -> torch.Tensor:
    batch = tokenizer([tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                     add_generation_prompt=True) for p in PROMPTS],
                      return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model(**batch).logits
    return out[batch["attention_mask"].bool()]


def test_lora_covers_gemma4s_projections_and_its_export_reloads_as_plain_transformers_weights(tmp_path):
    """LoRA adapts every q/k/v/o and MLP projection Gemma 4 has (k and v only where a layer computes them) and
    changes the logits; the export (adapter merged) reloads with plain transformers to the same logits, and its
    model card names Gemma 4's licence, Apache 2.0."""
    model, tokenizer = tiny_gemma4(lora=True)
    adapted = {name.split(".lora_A")[0].rsplit(".", 1)[-1] for name, _ in model.named_parameters() if "lora_A" in name}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    with model.disable_adapter():
        plain = _logits(model, tokenizer)
    tuned = _logits(model, tokenizer)
    assert (tuned - plain).abs().max() > 1e-3
    out = export_model(model, tokenizer, tmp_path / "export", base_name="tiny-gemma-4")
    planned = model_spec(str(out))  # transformers writes the full layers' shapes per layer: the same plan
    assert [planned.layer_shapes(i) for i in range(6)] == [MODELS["tiny-gemma-4"].layer_shapes(i) for i in range(6)]
    assert planned.params == MODELS["tiny-gemma-4"].params
    reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager")
    assert type(reloaded).__name__ == "Gemma4ForCausalLM"
    assert (_logits(reloaded, tokenizer) - tuned).abs().max() < 1e-4
    assert "license: apache-2.0" in (out / "README.md").read_text()
    assert "license: apache-2.0" in model_card("gemma-4-e2b-it") and "license: gemma" in model_card("gemma-3-1b-it")


def test_sft_and_grpo_steps_train_the_tiny_gemma4():
    """SFT steps and a GRPO step (through HF's forward: the lean one covers Gemma 2 and 3) with finite losses, each
    moving the LoRA weights; GRPO on rewards a random model already varies on (format tags, length), so its
    advantages are not all zero."""
    task = ArithmeticTask(num_demonstrations=16, num_test=8)
    model, tokenizer = tiny_gemma4(lora=True)

    def trainable() -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    start = trainable()
    sft = SFTTrainer(model, tokenizer, task.demonstrations(),
                     SFTConfig(batch_size=4, steps=2, warmup_steps=0, output_dir=None))
    rows = [sft.train_step() for _ in range(2)]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    after_sft = trainable()
    assert any(not torch.equal(after_sft[n], start[n]) for n in start)
    rewards = [soft_format_reward, make_length_penalty(12, 6, name="length_penalty")]
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, max_new_tokens=12, micro_batch_size=8, warmup_steps=0,
                     output_dir=None, reward_weights={"soft_format_reward": 1.0, "length_penalty": 1.0},
                     learning_rate=1e-3, temperature=1.0)
    row = GRPOTrainer(model, tokenizer, rewards, task.prompt_stream(), cfg).train_step()
    assert torch.isfinite(torch.tensor(row["policy_loss"])) and row["completion_length_mean"] > 0
    assert row["reward_std"] > 0, row
    assert any(not torch.equal(p, after_sft[n]) for n, p in trainable().items()), "GRPO moved no trainable weight"


def greedy_equals_generate(model: torch.nn.Module, tokenizer: object, roll: object, ids: torch.Tensor,
                           mask: torch.Tensor, new_tokens: int) -> None:
    stops = stop_token_ids(tokenizer)
    with torch.no_grad():
        want = base_model(model).generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                          do_sample=False, eos_token_id=stops,
                                          pad_token_id=tokenizer.pad_token_id)[:, ids.shape[1]:]
    for row in range(ids.shape[0]):
        got = roll.completion_ids[row][roll.completion_mask[row].bool()].tolist()
        expected = want[row].tolist()
        expected = expected[: next((i + 1 for i, t in enumerate(expected) if t in stops), len(expected))]
        assert got == expected, row


@pytest.mark.parametrize("lora", [False, True])
def test_the_lean_sampler_gives_hf_generates_greedy_tokens_on_the_tiny_gemma4(lora):
    """Greedy through the kit's own forward (`decoder.forward`, no fall-back) equals `generate` token for token,
    sliding window (16) exceeded, per-layer embeddings and shared keys and values included, with and without LoRA;
    prompts kept once per group (`share_prefix`) or per row alike."""
    model, tokenizer = tiny_gemma4(lora=lora, seed=3)
    if lora:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.05)
    assert sampling.decoder.supports(base_model(model))
    ids, mask = encode_prompts(tokenizer, PROMPTS, bucket=8)
    settings = SamplerSettings(max_new_tokens=24, greedy=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no word of HF's forward: the lean one runs
        roll = sample(model, ids, mask, settings, stop_ids=stop_token_ids(tokenizer), pad_id=tokenizer.pad_token_id)
        grouped = sample(model, ids.repeat_interleave(3, 0), mask.repeat_interleave(3, 0), settings,
                         stop_ids=stop_token_ids(tokenizer), pad_id=tokenizer.pad_token_id, group_size=3)
    greedy_equals_generate(model, tokenizer, roll, ids, mask, 24)
    assert torch.equal(grouped.completion_ids, roll.completion_ids.repeat_interleave(3, 0))


def test_a_model_the_lean_forward_does_not_cover_samples_through_hfs_and_says_so_once(monkeypatch):
    """A Gemma 4 with mixture-of-experts blocks (the 26B-A4B's kind) samples through transformers' forward: the same
    greedy tokens as `generate`, and one warning per model class."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(MODEL_SHAPES / "tiny-gemma-4")
    config.update({"enable_moe_block": True, "num_experts": 2, "top_k_experts": 1, "moe_intermediate_size": 16})
    config._attn_implementation = "eager"
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config).eval()
    tokenizer = build_tiny_tokenizer(gemma4=True)
    ids, mask = encode_prompts(tokenizer, PROMPTS, bucket=8)
    settings = SamplerSettings(max_new_tokens=24, greedy=True)
    monkeypatch.setattr(sampling, "_TOLD_HF_FORWARD", set())  # as in a fresh process
    stops = stop_token_ids(tokenizer)
    with pytest.warns(UserWarning, match="Gemma4TextDecoderLayer: .* without mixture-of-experts blocks only"):
        roll = sample(model, ids, mask, settings, stop_ids=stops, pad_id=tokenizer.pad_token_id)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per model class
        sample(model, ids, mask, settings, stop_ids=stops, pad_id=tokenizer.pad_token_id)
    greedy_equals_generate(model, tokenizer, roll, ids, mask, 24)


def test_a_multimodal_gemma4_checkpoint_loads_as_its_text_decoder_alone(tmp_path):
    """Google's E2B and E4B checkpoints are `Gemma4ForConditionalGeneration` (vision and audio towers beside the
    decoder). One made here, with the tiny Gemma 4's decoder and small towers, loads through `load_model` as a
    `Gemma4ForCausalLM` holding no tower weight, with the full model's logits on text exactly; its tokenizer's turn
    end is a stop token. A checkpoint whose decoder weights are not where Gemma 4 keeps them is refused."""
    import json

    from transformers import (
        Gemma4AudioConfig,
        Gemma4Config,
        Gemma4ForConditionalGeneration,
        Gemma4TextConfig,
        Gemma4VisionConfig,
    )

    from grpo_kit.engine.hub import MODEL_SHAPES

    text = Gemma4TextConfig(**json.loads((MODEL_SHAPES / "tiny-gemma-4" / "config.json").read_text()))
    config = Gemma4Config(
        text_config=text, audio_config=Gemma4AudioConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2),
        vision_config=Gemma4VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, head_dim=16),
        image_token_id=100, audio_token_id=101, boi_token_id=102, eoi_token_id=103, boa_token_id=104,
        eoa_token_index=105, video_token_id=99)
    torch.manual_seed(0)
    full = Gemma4ForConditionalGeneration(config).eval()
    full.save_pretrained(tmp_path / "gemma4")
    build_tiny_tokenizer(gemma4=True).save_pretrained(tmp_path / "gemma4")
    model, tokenizer = load_model(ModelConfig(name=str(tmp_path / "gemma4"), lora=False), torch.device("cpu"))
    assert type(model).__name__ == "Gemma4ForCausalLM"
    assert not any("tower" in n or "embed_vision" in n or "embed_audio" in n for n, _ in model.named_parameters())
    assert count_parameters(model)["total"] == MODELS["tiny-gemma-4"].params
    ids = torch.randint(6, 99, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, full(input_ids=ids).logits)
    assert tokenizer.convert_tokens_to_ids("<turn|>") in stop_token_ids(tokenizer)

    broken = {k.replace("language_model", "text_model"): v for k, v in full.state_dict().items()}
    full.save_pretrained(tmp_path / "moved", state_dict=broken)
    build_tiny_tokenizer(gemma4=True).save_pretrained(tmp_path / "moved")
    with pytest.raises(ValueError, match="its Gemma 4 text decoder lacks"):
        load_model(ModelConfig(name=str(tmp_path / "moved"), lora=False), torch.device("cpu"))


def test_the_committed_tiny_gemma4_files_match_the_script(tmp_path):
    from grpo_kit.engine.models import write_tiny_gemma_files

    write_tiny_gemma_files(tmp_path, "tiny-gemma-4")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / name).read_text() == (MODEL_SHAPES / "tiny-gemma-4" / name).read_text(), name


def test_gemma4s_chat_template_token_by_token():
    """Gemma 4's turn format in the tiny Gemma 4's tokenizer: a native system turn, each turn closed by `<turn|>`,
    each control token one token; thinking off (the default) closes an empty thought channel in the generation
    prompt, thinking on opens the system turn with `<|think|>` and leaves the channel to the model. Gemma 3's
    template folds the system message into the user turn instead."""
    gemma4, gemma3 = load_tokenizer("tiny-gemma-4"), load_tokenizer("tiny-gemma")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]

    def render(tokenizer: object, **kwargs: object) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)

    assert render(gemma4) == ("<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\n2+2?<turn|>\n"
                              "<|turn>model\n<|channel>thought\n<channel|>")
    assert render(gemma4, enable_thinking=True) == ("<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n"
                                                    "<|turn>user\n2+2?<turn|>\n<|turn>model\n")
    assert render(gemma3) == "<bos><start_of_turn>user\nBe brief.\n\n2+2?<end_of_turn>\n<start_of_turn>model\n"
    tokens = gemma4.convert_ids_to_tokens(gemma4(render(gemma4), add_special_tokens=False)["input_ids"])
    assert all(tokens.count(t) >= 1 for t in ("<|turn>", "<turn|>", "<|channel>", "<channel|>"))
    assert tokens[:2] == ["<bos>", "<|turn>"] and tokens[-1] == "<channel|>"
    assert {t: gemma4.convert_tokens_to_ids(t) for t in GEMMA4_TOKENS} == {t: 4 + i for i, t in
                                                                          enumerate(GEMMA4_TOKENS)}


def test_demonstrations_end_with_gemma4s_turn_end():
    rows = ArithmeticTask(num_demonstrations=4, num_test=2).demonstrations()
    for name, end in (("tiny-gemma-4", "<turn|>"), ("tiny-gemma", "<end_of_turn>")):
        tokenizer = load_tokenizer(name)
        (ids, _), *_ = encode_demonstrations(tokenizer, rows, max_length=256)
        assert tokenizer.convert_ids_to_tokens(ids[-1]) == end, name


def test_a_thinking_gemma4s_thoughts_are_its_reasoning_for_the_rewards():
    """What the rewards and the evaluation read of a completion (`decode_completions`), on both families: Gemma 4's
    thought channel becomes the reasoning block (an empty channel vanishes), so the strict format and correctness
    rewards score a thinking Gemma 4 as they score Gemma 3 writing the tags; Gemma 3's text is decoded as before."""
    gemma4, gemma3 = load_tokenizer("tiny-gemma-4"), load_tokenizer("tiny-gemma")
    written = {
        gemma4: ["<|channel>thought\n3 + 4 = 7<channel|><answer>7</answer><turn|>",
                 "<|channel>thought\n<channel|><reasoning>3 + 4 = 7</reasoning><answer>7</answer><turn|>",
                 "<answer>8</answer><turn|>"],
        gemma3: ["<reasoning>3 + 4 = 7</reasoning><answer>7</answer><end_of_turn>",
                 "<reasoning>3 + 4 = 7</reasoning><answer>7</answer><eos>", "<answer>8</answer><end_of_turn>"],
    }
    for tokenizer, texts in written.items():
        ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        completions = decode_completions(tokenizer, ids)
        assert completions[:2] == ["<reasoning>3 + 4 = 7</reasoning><answer>7</answer>"] * 2, completions
        assert strict_format_reward(["q"] * 3, completions) == [1.0, 1.0, 0.0]
        assert correctness_reward(["q"] * 3, completions, answer=["7"] * 3) == [1.0, 1.0, 0.0]
    ids = [gemma3("<reasoning>a</reasoning> <answer>1</answer><end_of_turn>", add_special_tokens=False)["input_ids"]]
    assert decode_completions(gemma3, ids) == gemma3.batch_decode(ids, skip_special_tokens=True)


def test_the_per_layer_table_kept_on_the_host_gives_the_same_numbers():
    """`ModelConfig(ple_on_host=True)`: the table stays out of the move, frozen, in the checkpoint's dtype (bf16 here),
    looked up through hooks that send its rows to the model's device and dtype; logits and greedy tokens equal a
    float32 model holding the same (bf16-valued) table. Refused on a TPU."""
    from grpo_kit.engine import models

    kept, tokenizer = load_model(ModelConfig(name="tiny-gemma-4", ple_on_host=True, seed=2), torch.device("cpu"))
    plain, _ = load_model(ModelConfig(name="tiny-gemma-4", seed=2), torch.device("cpu"))
    table = kept.model.embed_tokens_per_layer.to(torch.bfloat16)
    with torch.no_grad():
        plain.model.embed_tokens_per_layer.weight.copy_(table.weight.float())
    assert not table.weight.requires_grad and plain.model.embed_tokens_per_layer.weight.requires_grad
    ids, mask = encode_prompts(tokenizer, PROMPTS, bucket=8)
    with torch.no_grad():
        logits = [m(input_ids=ids, attention_mask=mask).logits for m in (kept, plain)]
    assert torch.equal(logits[0], logits[1])
    settings = SamplerSettings(max_new_tokens=12, greedy=True)
    rolls = [sample(m, ids, mask, settings, stop_ids=[1, 5], pad_id=0) for m in (kept, plain)]
    assert torch.equal(rolls[0].completion_ids, rolls[1].completion_ids)
    assert "model.embed_tokens_per_layer.weight" in kept.state_dict()  # saved and exported under its own name
    with pytest.raises(ValueError, match="ple_on_host=True\\) is for GPUs and the CPU"):
        with models._ple_kept_on_host(plain, torch.device("xla"), keep=True):
            pass


def test_notebooks_08_and_09_offer_gemma4_where_the_runtime_has_its_preset(monkeypatch, capsys, tmp_path):
    """`MODEL = "gemma-4-e2b-it"` in 08/09 picks the board's or the GPU's E2B preset; a CPU keeps Gemma 3 270M and says
    so; notebook 00's `model_choices` names both presets with the planner's memory and the expected step. Without
    access to Gemma 4 (no hub here) the capstone falls back as it does for Gemma 3 1B, saying which model it could
    not load."""
    from grpo_kit.course import notebook as nbk

    assert nbk.capstone_preset("v5e-8", model="gemma-4-e2b-it") == "tpu-v5e-8-gemma-4-e2b"
    assert nbk.capstone_preset("cuda", model="gemma-4-e2b-it") == "gpu-gemma-4-e2b"
    assert nbk.capstone_preset("v5e-8") == "tpu-v5e-8-gemma-3-1b" and nbk.capstone_preset("cuda") == "gpu-gemma-3-1b"
    assert nbk.capstone_preset("cpu", model="gemma-4-e2b-it") == "cpu-gemma-270m"
    assert "gemma-4-e2b-it: no CPU preset" in capsys.readouterr().out
    kaggle = nbk.model_choices("v5e-8")
    assert kaggle[0].startswith("Gemma 3 1B-IT (MODEL = None): preset tpu-v5e-8-gemma-3-1b · ")
    assert kaggle[1].startswith('Gemma 4 E2B-IT (MODEL = "gemma-4-e2b-it"): preset tpu-v5e-8-gemma-4-e2b · ')
    assert "of 16 GiB per device · ≈ 28 s a GRPO step (estimate)" in kaggle[1]
    assert "of 15 GiB per device · ≈ 40 s a GRPO step (estimate)" in nbk.model_choices("cuda")[1]  # planned as a T4
    assert all("no CPU preset" in line for line in nbk.model_choices("cpu"))

    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    monkeypatch.setenv("GRPO_KIT_RUNS_DIR", str(tmp_path))
    monkeypatch.setattr(nbk, "model_access", lambda name, token=None: (
        name == "gemma-3-270m-offline", "PyPI" if name == "gemma-3-270m-offline" else "no hub here"))
    monkeypatch.setattr(nbk, "_task_that_loads", lambda cfg: cfg)
    cfg, preset = nbk.capstone_config(model="gemma-4-e2b-it")
    assert (preset, cfg.model.name) == ("cpu-gemma-270m", "gemma-3-270m-offline")
    assert "google/gemma-4-E2B-it cannot be loaded here" in capsys.readouterr().out
