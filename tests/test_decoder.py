"""The lean Gemma forward (`decoder.py`) and the group-shared prompt forwards agree with HF's forward.

Checked on the shapes where they could go wrong: left padding, sliding-window layers with a window shorter
than the prompt, Gemma 2's attention and final softcaps, LoRA layers, and prompt sharing across a group.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Gemma2Config

from grpo_kit.data.chat import stop_token_ids
from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
from grpo_kit.engine import decoder
from grpo_kit.engine.logprobs import ForwardOptions, HeadOptions, completion_logprobs
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import TINY_CONFIG, add_lora, load_model, random_model
from grpo_kit.engine.sampling import SamplerSettings, encode_prompts, sample
from grpo_kit.train.config import GRPOConfig
from grpo_kit.train.grpo import GRPOTrainer


def gemma3_sliding(window: int = 6, vocab_size: int | None = None) -> torch.nn.Module:
    """The tiny Gemma 3 with half its layers on a sliding window (6 tokens: shorter than the prompts), and as in
    the real Gemma 3 a different RoPE base for them (local 10k, global 1M): a decoder that used one table for
    both kinds of layer would differ from HF's forward."""
    cfg = {k: v for k, v in TINY_CONFIG.items() if k != "architectures"}
    cfg.update(sliding_window=window, layer_types=["sliding_attention", "full_attention"] * 2,
               rope_theta=1_000_000.0, rope_local_base_freq=10_000.0)
    if vocab_size is not None:
        cfg["vocab_size"] = vocab_size
    config = AutoConfig.for_model(**cfg)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


def gemma2_softcapped() -> torch.nn.Module:
    config = Gemma2Config(vocab_size=106, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6, pad_token_id=0,
                          eos_token_id=1, bos_token_id=2)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    assert config.attn_logit_softcapping and config.final_logit_softcapping
    return model


def working_lora(model: torch.nn.Module) -> torch.nn.Module:
    """A LoRA that does something: peft starts B at zero."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    return model.eval()


def lora_gemma3() -> torch.nn.Module:
    return working_lora(add_lora(gemma3_sliding(), ModelConfig(lora=True)))


def lora_gemma3_large_vocabulary() -> torch.nn.Module:
    """LoRA on a Gemma 3 whose vocabulary (40,000) is large enough for the paths Gemma's 262k vocabulary takes:
    the decode step's block-wise LM head (`decoder.lm_head_logits`) and the fused frozen-head log-probs
    (`logprobs.frozen_head_logprobs`). Token ids stay below 106, as the test batches make them."""
    return working_lora(add_lora(gemma3_sliding(vocab_size=40_000), ModelConfig(lora=True)))


def gemma4_tiny() -> torch.nn.Module:
    """The kit's tiny random Gemma 4: per-layer embeddings, its last two layers reading earlier layers' keys and
    values, keys as values on full layers, head 16 / 32 by kind, a window (16) shorter than prompt and completion."""
    return load_model(ModelConfig(name="tiny-gemma-4", lora=False, seed=1), torch.device("cpu"))[0].eval()


def gemma4_lora() -> torch.nn.Module:
    return working_lora(add_lora(gemma4_tiny(), ModelConfig(lora=True)))


def gemma4_e2b_shapes() -> torch.nn.Module:
    """Random weights of Gemma 4 E2B's real layer shapes (hidden 1536, 8 query heads and 1 key head of 256 on sliding
    layers and 512 on full ones, partial RoPE there, MLP 6144 and 12288 on KV-shared layers, PLE 256): four layers,
    the last two KV-shared, a 4,096-token vocabulary and a 6-token window, so both kinds, the sharing and the window
    all show."""
    return random_model("gemma-4-e2b-it", layers=4, kv_shared_layers=2, vocab_size=4096, sliding_window=6)


MODELS = {"gemma3-sliding": gemma3_sliding, "gemma2-softcap": gemma2_softcapped, "gemma3-lora": lora_gemma3,
          "gemma3-lora-large-vocab": lora_gemma3_large_vocabulary, "gemma4-tiny": gemma4_tiny,
          "gemma4-lora": gemma4_lora, "gemma4-e2b-shapes": gemma4_e2b_shapes}


def grouped_batch(groups: int = 3, group: int = 4, prompt: int = 20, new: int = 14) -> tuple[torch.Tensor, ...]:
    """Prompts repeated `group` times with different left padding per group, random completions, one of
    which stops early."""
    gen = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(6, 100, (groups, prompt), generator=gen).repeat_interleave(group, 0)
    prompt_mask = torch.ones_like(prompt_ids)
    for g, pad in enumerate((3, 0, 9)[:groups]):
        prompt_mask[g * group : (g + 1) * group, :pad] = 0
    prompt_ids = prompt_ids.masked_fill(prompt_mask == 0, 0)
    completion_ids = torch.randint(6, 100, (groups * group, new), generator=gen)
    completion_mask = torch.ones_like(completion_ids)
    completion_mask[1, 9:] = 0
    completion_mask[5, 3:] = 0
    completion_mask[6, 1:] = 0  # stopped at its first token
    completion_ids = completion_ids.masked_fill(completion_mask == 0, 0)
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def base_of(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def gemma4_moe() -> torch.nn.Module:
    """A tiny Gemma 4 with mixture-of-experts blocks (26B-A4B's kind of layer), which the lean forward does not run."""
    return random_model("tiny-gemma-4", layers=2, enable_moe_block=True, num_experts=2, top_k_experts=1,
                        moe_intermediate_size=16)


def test_supports_gemma_only():
    assert decoder.supports(gemma3_sliding()) and decoder.supports(gemma2_softcapped())
    assert decoder.supports(gemma4_tiny()) and not decoder.supports(gemma4_moe())
    assert not decoder.supports(torch.nn.Linear(2, 2))


def test_gemma4s_kv_shared_layers_read_the_last_earlier_layer_of_their_kind():
    cfg = gemma4_tiny().config
    assert cfg.layer_types[:4] == ["sliding_attention", "full_attention"] * 2 and cfg.num_kv_shared_layers == 2
    assert decoder.kv_entries(cfg) == [0, 1, 2, 3, 2, 3]
    assert [m == "store" for m in cfg.kv_sharing_modes] == [False, False, True, True, False, False]
    assert decoder.kv_entries(gemma3_sliding().config) == [0, 1, 2, 3]


@pytest.mark.parametrize("name", MODELS)
def test_lean_prefill_logits_equal_hf_forward(name):
    model = MODELS[name]()
    hf = model.get_base_model() if hasattr(model, "get_base_model") else model
    prompt_ids, prompt_mask, _, _ = grouped_batch()
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions, use_cache=False).logits
        cache = decoder.KVCache.empty(hf, prompt_ids.shape[0], prompt_ids.shape[1] + 4,
                                      torch.cat([prompt_mask, torch.ones(prompt_ids.shape[0], 4, dtype=torch.long)], 1))
        consts = decoder.Constants.build(hf, prompt_ids.shape[1] + 4)
        lean = decoder.forward(
            hf, prompt_ids, positions, cache, torch.zeros(1, dtype=torch.long), consts, output="all_logits"
        )
    real = prompt_mask.bool()
    assert (lean[real] - ref[real]).abs().max() < TOLERANCE.get(name, 1e-5)


TOLERANCE = {"gemma4-e2b-shapes": 1e-4}
"""The largest logit, log-prob or entropy difference a model's two paths may show (default 1e-5): float summation
order, which E2B's 1,536-wide products move by up to 4e-5 (logits of ±8 over 4,096 entries)."""
GRADIENT_TOLERANCE = {"gemma4-e2b-shapes": 3e-4}
"""The largest gradient difference relative to its norm (default 1e-5). E2B's shapes with random weights have
attention gradients of norm ~2e4 in their first layer, where every path (HF's own shared-prompt forward too) differs
from HF's plain one by 1.6e-4 of the norm."""


def assert_same_up_to_cdf_boundaries(first, second, tol: float = 1e-5) -> None:
    """Two rollouts from the same noise: the same tokens and log-probs within 1e-5, except that a row may part where
    its uniform falls on the boundary between two neighbouring entries of the inverse CDF, which the float summation
    order of 40,000 near-equal masses moves (the random large-vocabulary model; on an AVX2-only CPU one row of 12
    parts at its 15th token, 10,431 against 10,432, its log-probs until then within 1e-6). There the two tokens are
    neighbours and the row's rest is not compared; at most a quarter of the rows part."""
    same = torch.cumprod((first.completion_ids == second.completion_ids).long(), 1).bool()
    parted = (~same).any(1).nonzero().flatten().tolist()
    assert len(parted) <= len(same) // 4, parted
    for row in parted:
        col = int((~same[row]).nonzero()[0])
        a, b = int(first.completion_ids[row, col]), int(second.completion_ids[row, col])
        assert abs(a - b) == 1, (row, col, a, b)
    kept = same & first.completion_mask.bool()
    assert (first.sampling_logprobs - second.sampling_logprobs).abs()[kept].max() < tol


@pytest.mark.parametrize("name", MODELS)
def test_lean_sampler_equals_hf_sampler(name, monkeypatch):
    """Same noise, same tokens and log-probs through the lean forward and through HF's StaticCache forward, up to
    the inverse CDF's boundaries (`assert_same_up_to_cdf_boundaries`). Plain products on both sides: the random
    models' flat distributions over 40,000 entries turn a product's summation order into other tokens (the
    prepacked products: `test_prepacked_products_…`)."""
    monkeypatch.setenv("GRPO_KIT_CPU_PREPACK", "0")
    model = MODELS[name]()
    prompt_ids, prompt_mask, _, _ = grouped_batch()
    rolls = [
        sample(model, prompt_ids, prompt_mask, SamplerSettings(max_new_tokens=16, temperature=1.0, lean=lean),
               stop_ids=[1], pad_id=0, generator=torch.Generator().manual_seed(3))
        for lean in (True, False)
    ]
    assert_same_up_to_cdf_boundaries(rolls[0], rolls[1], tol=TOLERANCE.get(name, 1e-5))


@pytest.mark.parametrize("name", MODELS)
def test_finished_rows_leaving_the_batch_change_nothing(name):
    """With many stop tokens rows finish at different steps, so the eager lean sampler drops them from the
    batch several times; tokens, log-probs, masks and truncation equal the fixed-batch HF-forward sampler's."""
    model = MODELS[name]()
    prompt_ids, prompt_mask, _, _ = grouped_batch()
    stops = list(range(1, 20))
    vocab = base_of(model).config.vocab_size
    stops += list(range(106, vocab, 4))  # a large vocabulary: every 4th token stops too, so rows still finish early
    rolls = [
        sample(model, prompt_ids, prompt_mask, SamplerSettings(max_new_tokens=24, temperature=1.0, lean=lean),
               stop_ids=stops, pad_id=0, generator=torch.Generator().manual_seed(4), group_size=4)
        for lean in (True, False)
    ]
    lengths = rolls[1].completion_mask.sum(1)
    assert (lengths <= 3).float().mean() >= 0.25 and lengths.max() > 6  # rows did leave while others ran on
    for field in ("completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(rolls[0], field), getattr(rolls[1], field)), field
    assert (rolls[0].sampling_logprobs - rolls[1].sampling_logprobs).abs().max() < TOLERANCE.get(name, 1e-5)


def lora_variant(variant: str) -> torch.nn.Module:
    """The working LoRA model in a state the rollout's `LinearParts` must respect (or leave to peft)."""
    if variant == "dora":
        from peft import LoraConfig, get_peft_model

        return working_lora(
            get_peft_model(
                gemma3_sliding(), LoraConfig(r=4, target_modules=["q_proj", "o_proj", "up_proj"], use_dora=True)
            )
        )
    model = lora_gemma3()
    if variant == "merged":
        model.merge_adapter()
    return model


@pytest.mark.parametrize("variant", ["active", "disabled", "merged", "dora"])
def test_rollout_lora_parts_follow_peft(variant):
    """Rollouts apply LoRA layers as W x + (A x)(s·B) — one matmul for q, k and v together — with adapters
    active; the base weights alone when they are disabled or merged; a DoRA layer through peft. Each way the
    lean sampler gives the HF-forward sampler's tokens and log-probs, and the fused q/k/v carries the LoRA."""
    model = lora_variant(variant)
    hf = model.get_base_model()
    attn = hf.model.layers[0].self_attn
    prompt_ids, prompt_mask, _, _ = grouped_batch()
    with model.disable_adapter() if variant == "disabled" else contextlib.nullcontext():
        consts = decoder.Constants.build(hf, 8)
        if variant == "dora":
            assert id(attn.q_proj) not in consts.linears and id(attn) not in consts.fused_qkv
        else:
            assert id(attn) in consts.fused_qkv and len(consts.linears) == 7 * len(hf.model.layers)
            assert (consts.fused_qkv[id(attn)][0][2] is not None) == (variant == "active")
        rolls = [
            sample(model, prompt_ids, prompt_mask, SamplerSettings(max_new_tokens=12, temperature=1.0, lean=lean),
                   stop_ids=[1], pad_id=0, generator=torch.Generator().manual_seed(6), group_size=4)
            for lean in (True, False)
        ]
    assert torch.equal(rolls[0].completion_ids, rolls[1].completion_ids)
    assert (rolls[0].sampling_logprobs - rolls[1].sampling_logprobs).abs().max() < 1e-5


def test_common_left_padding_and_a_window_the_rollout_outgrows():
    """Prompts that all begin with padding columns (the eager sampler drops them) and sliding layers whose
    window the rollout outgrows half-way (decode steps go from the cached key bias to the windowed one):
    the same tokens, log-probs and masks as through HF's forward, and the rollout keeps the prompts as given."""
    model = gemma3_sliding(window=24)
    prompt_ids, prompt_mask, _, _ = grouped_batch()  # 20 columns, 11 to 20 real tokens
    padding = torch.zeros(prompt_ids.shape[0], 5, dtype=torch.long)
    prompt_ids, prompt_mask = torch.cat([padding, prompt_ids], 1), torch.cat([padding, prompt_mask], 1)
    rolls = [
        sample(model, prompt_ids, prompt_mask, SamplerSettings(max_new_tokens=16, temperature=1.0, lean=lean),
               stop_ids=[1], pad_id=0, generator=torch.Generator().manual_seed(5), group_size=4)
        for lean in (True, False)
    ]
    assert torch.equal(rolls[0].prompt_ids, prompt_ids) and torch.equal(rolls[0].prompt_mask, prompt_mask)
    for field in ("completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(rolls[0], field), getattr(rolls[1], field)), field
    assert rolls[1].completion_mask.sum(1).max() > 24 - 20  # some row decoded past the window
    assert (rolls[0].sampling_logprobs - rolls[1].sampling_logprobs).abs().max() < 1e-5


@pytest.mark.parametrize("name", MODELS)
def test_group_prefill_equals_per_row_prefill(name):
    model = MODELS[name]()
    prompt_ids, prompt_mask, _, _ = grouped_batch()
    a, b = (
        sample(model, prompt_ids, prompt_mask, SamplerSettings(max_new_tokens=16, temperature=1.0), stop_ids=[1],
               pad_id=0, generator=torch.Generator().manual_seed(3), group_size=g)
        for g in (1, 4)
    )
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.completion_mask, b.completion_mask)
    assert (a.sampling_logprobs - b.sampling_logprobs).abs().max() < TOLERANCE.get(name, 1e-5)


# rows run to the end; rows leave (the prefix is copied out)
@pytest.mark.parametrize("stops", [[1], list(range(1, 20))])
def test_prompt_cache_kept_once_per_group_equals_a_copy_per_row(monkeypatch, stops):
    """The eager CPU sampler keeps each group's prompt keys and values once (`KVCache.share_prefix`): same tokens,
    log-probs, head moments and masks as with the prompt's cache copied to every row of the group."""
    model = working_lora(add_lora(gemma3_sliding(window=64), ModelConfig(lora=True)))  # no window cuts into the prompt
    prompt_ids, prompt_mask, _, _ = grouped_batch()
    shared = []
    share_prefix = decoder.KVCache.share_prefix
    monkeypatch.setattr(decoder.KVCache, "share_prefix", lambda self, *a: shared.append(a) or share_prefix(self, *a))

    def roll() -> object:
        return sample(model, prompt_ids, prompt_mask,
                      SamplerSettings(max_new_tokens=16, temperature=1.0,
                                      head_moments=True, product_dtype=torch.float32),
                      stop_ids=stops, pad_id=0, group_size=4, generator=torch.Generator().manual_seed(6))

    with_prefix = roll()
    assert shared == [(4, prompt_ids.shape[1] - int(prompt_mask.any(0).int().argmax()))]
    monkeypatch.setattr(decoder, "shares_prefix", lambda hf, length: False)
    copied = roll()
    assert len(shared) == 1
    if len(stops) > 1:
        assert (copied.completion_mask.sum(1) <= 3).any() and copied.completion_mask.sum(1).max() > 5
    for field in ("completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(with_prefix, field), getattr(copied, field)), field
    for field in ("sampling_logprobs", "head_mean", "entropy"):
        assert (getattr(with_prefix, field) - getattr(copied, field)).abs().max() < 1e-5, field


def test_a_window_shorter_than_the_rollout_or_an_attention_softcap_keeps_a_copy_per_row():
    assert decoder.shares_prefix(gemma3_sliding(window=64), 64)
    assert not decoder.shares_prefix(gemma3_sliding(window=6), 7)
    assert not decoder.shares_prefix(gemma2_softcapped(), 4)


def test_group_size_rejects_rows_that_are_not_grouped():
    model = gemma3_sliding()
    prompt_ids, prompt_mask, _, _ = grouped_batch()
    with pytest.raises(ValueError, match="runs of 4 identical rows"):
        sample(model, prompt_ids.roll(1, 0), prompt_mask, SamplerSettings(max_new_tokens=4, greedy=True), stop_ids=[1],
               pad_id=0, group_size=4)
    with pytest.raises(ValueError, match="runs of 5"):
        sample(model, prompt_ids, prompt_mask, SamplerSettings(max_new_tokens=4, greedy=True), stop_ids=[1], pad_id=0,
               group_size=5)


@pytest.mark.parametrize("name", MODELS)
def test_shared_and_padding_free_logprobs_and_gradients_equal_the_plain_forward(name):
    """Group-shared prompts (HF cache) and the padding-free packed forward, with and without sharing: the
    same log-probs, entropies and gradients (all parameters: norms, embeddings, LoRA) as HF's plain forward."""
    model = MODELS[name]().train()
    prompt_ids, prompt_mask, completion_ids, completion_mask = grouped_batch()
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    weights = torch.randn(completion_ids.shape, generator=torch.Generator().manual_seed(2)) * completion_mask
    params = [p for p in model.parameters() if p.requires_grad]
    results = {}
    for group, packed in ((1, False), (4, False), (1, True), (4, True)):
        logp, entropy = completion_logprobs(model, ids, attn, prompt_ids.shape[1], temperature=0.7,
                                            forward=ForwardOptions(group_size=group, padding_free=packed))
        grads = torch.autograd.grad((logp * weights).sum() + (entropy * weights).sum(), params)
        results[group, packed] = (logp.detach(), entropy.detach(), grads)
    lp1, en1, g1 = results[1, False]
    real = completion_mask.bool()
    for key, (lp, en, g) in results.items():
        tol = TOLERANCE.get(name, 1e-5)
        assert (lp1 - lp)[real].abs().max() < tol and (en1 - en)[real].abs().max() < tol, key
        for a, b in zip(g1, g, strict=True):
            assert (a - b).norm() <= GRADIENT_TOLERANCE.get(name, 1e-5) * a.norm() + 1e-7, key
        if key[1]:  # padding-free: nothing computed at padding
            assert not lp[~real].any() and not en[~real].any()


def test_padding_free_rejects_a_gap_in_the_completion_mask():
    model = gemma3_sliding()
    prompt_ids, prompt_mask, completion_ids, completion_mask = grouped_batch()
    completion_mask[0, 4] = 0  # a hole before later real tokens: not something `sample` produces
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    with pytest.raises(ValueError, match="gap"):
        completion_logprobs(model, ids, attn, prompt_ids.shape[1], forward=ForwardOptions(padding_free=True))


def test_shared_prompt_forward_with_one_completion_token():
    model = gemma3_sliding()
    prompt_ids, prompt_mask, completion_ids, completion_mask = grouped_batch(new=1)
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        a, _ = completion_logprobs(model, ids, attn, prompt_ids.shape[1])
        b, _ = completion_logprobs(model, ids, attn, prompt_ids.shape[1], forward=ForwardOptions(group_size=4))
        c, _ = completion_logprobs(model, ids, attn, prompt_ids.shape[1],
                                   forward=ForwardOptions(group_size=4, padding_free=True))
    assert b.shape == c.shape == (12, 1) and (a - b).abs().max() < 1e-5 and (a - c).abs().max() < 1e-5


def test_grpo_step_same_with_and_without_prompt_sharing_and_padding(sft_state, task):
    """Two trainer steps from the same weights — padding-free and shared (the default), shared only, plain:
    same rollouts, rewards, losses and gradient norms."""
    from grpo_kit.engine.models import load_model

    rows = []
    for share, packed in ((True, True), (True, False), (False, False)):
        model, tok = load_model(ModelConfig(), torch.device("cpu"))
        model.load_state_dict(sft_state)
        cfg = GRPOConfig(prompts_per_step=4, group_size=4, micro_batch_size=8, max_new_tokens=24, beta=0.04,
                         log_kl=True, share_prompt_forward=share, padding_free=packed, output_dir=None,
                         log_completions=0, reward_weights=DEFAULT_WEIGHTS)
        trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(seed=5), cfg)
        rows.append([trainer.train_step() for _ in range(2)])
    for packed, shared, plain in zip(*rows, strict=True):
        for row in (packed, shared):
            assert row["reward_mean"] == plain["reward_mean"]
            for key in ("policy_loss", "grad_norm", "kl"):
                assert abs(row[key] - plain[key]) <= 1e-5 * max(1.0, abs(plain[key])), key


def test_greedy_group_prefill_on_the_trained_tiny_gemma(sft_model, task):
    model, tok = sft_model
    ids, mask = encode_prompts(tok, list(task.test_set()["prompt"][:3]), bucket=16)
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    a = sample(model, ids, mask, SamplerSettings(max_new_tokens=20, greedy=True), stop_ids=stop_token_ids(tok),
               pad_id=tok.pad_token_id)
    b = sample(model, ids, mask, SamplerSettings(max_new_tokens=20, greedy=True), stop_ids=stop_token_ids(tok),
               pad_id=tok.pad_token_id, group_size=4)
    assert torch.equal(a.completion_ids, b.completion_ids)


def test_compiled_sampler_equals_eager(sft_model, task):
    """`compile_sampler`: the same tokens from the same noise, log-probs equal to float precision."""
    model, tok = sft_model
    ids, mask = encode_prompts(tok, list(task.test_set()["prompt"][:2]), bucket=16)
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    eager, compiled = (
        sample(model, ids, mask, SamplerSettings(max_new_tokens=12, temperature=1.0, compiled=c),
               stop_ids=stop_token_ids(tok), pad_id=tok.pad_token_id,
               generator=torch.Generator().manual_seed(0), group_size=4)
        for c in (False, True)
    )
    assert torch.equal(eager.completion_ids, compiled.completion_ids)
    assert (eager.sampling_logprobs - compiled.sampling_logprobs).abs().max() < 1e-4


def test_shared_prompt_forward_under_gradient_checkpointing_equals_plain():
    """HF layers drop the KV cache under gradient checkpointing; the shared forward must not lose the prompt."""
    model = gemma3_sliding().train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    prompt_ids, prompt_mask, completion_ids, completion_mask = grouped_batch()
    ids, attn = torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1)
    a, _ = completion_logprobs(model, ids, attn, prompt_ids.shape[1])
    b, _ = completion_logprobs(model, ids, attn, prompt_ids.shape[1], forward=ForwardOptions(group_size=4))
    real = completion_mask.bool()
    assert (a - b)[real].abs().max() < 1e-5


def test_compile_sampler_default_is_on_for_cuda_only(task):
    """None (the default) compiles the decode step on CUDA only; an explicit value wins."""
    from grpo_kit.engine.models import load_model

    model, tok = load_model(ModelConfig(), torch.device("cpu"))
    for setting, expected in ((None, False), (True, True), (False, False)):
        cfg = GRPOConfig(compile_sampler=setting, output_dir=None)
        assert GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(seed=0), cfg).sampler.compiled is expected


def lora_gemma3_streamed_vocabulary() -> torch.nn.Module:
    """LoRA on a Gemma 3 with 40,960 = 80 × 512 vocabulary entries: large and even enough for the CPU sampler to
    stream the head through the draw (`streamed_head.draw_from_head`), as it does Gemma's 262,144. Its (tied) head is
    scaled up so the policy is peaked, as a trained model's is: over a random init's nearly flat distribution
    Σ_v π_v W_v is close to 0 and an error in it would hardly show."""
    model = gemma3_sliding(vocab_size=40_960)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    return working_lora(add_lora(model, ModelConfig(lora=True)))


def rollout_with_early_stops(
    model: torch.nn.Module, *, top_p: float = 1.0, product_dtype: torch.dtype | None = None
) -> object:
    """A grouped rollout with head moments in which some rows stop early: tokens that a first rollout drew midway
    through rows 1 and 6 are made stop tokens, and the same draws (same seed) end those rows there."""
    prompt_ids, prompt_mask, _, _ = grouped_batch()

    def draw(stops: list[int]) -> object:
        return sample(model, prompt_ids, prompt_mask,
                      SamplerSettings(max_new_tokens=12, temperature=0.9,
                                      top_p=top_p, head_moments=True, product_dtype=product_dtype),
                      stop_ids=stops, pad_id=0, generator=torch.Generator().manual_seed(3), group_size=4)

    first = draw([])
    return draw([int(first.completion_ids[1, 4]), int(first.completion_ids[6, 8])])


def completion_logits(hf: torch.nn.Module, roll: object) -> torch.Tensor:
    """(B, N, V) float64 logits at each completion token, from a plain forward over the finished sequences."""
    with torch.no_grad():
        out = hf(input_ids=roll.input_ids, attention_mask=roll.attention_mask,
                 position_ids=decoder.position_ids_from_mask(roll.attention_mask), use_cache=False)
    return out.logits[:, roll.prompt_ids.shape[1] - 1 : -1].double()


@pytest.mark.parametrize("top_p", [1.0, 0.9])  # streamed through the draw, and from the full logits
def test_head_moments_kept_by_the_sampler_are_the_policys(top_p):
    """`SamplerSettings(head_moments=True)`: at every sampled token, Σ_v π_v W_v and the entropy of the
    temperature-scaled policy, as a plain forward over the finished sequences computes them (float64); 0 after each
    stop token, rows that stopped early included."""
    from grpo_kit.engine.choice import head_moments

    model = lora_gemma3_streamed_vocabulary()
    roll = rollout_with_early_stops(model, top_p=top_p)
    mask = roll.completion_mask.bool()
    assert 0 < int(mask.sum()) < mask.numel() and roll.head_mean.shape == (*mask.shape,
                                                                           base_of(model).config.hidden_size)
    hf = base_of(model)
    logits = completion_logits(hf, roll)
    want = head_moments(logits, hf.lm_head.weight.double(), 0.9)
    scale = want.mean_row[mask].abs().max()
    assert (roll.head_mean[mask].double() - want.mean_row[mask]).abs().max() < 1e-4 * scale
    assert (roll.entropy[mask].double() - want.entropy[mask]).abs().max() < 1e-4
    assert not roll.head_mean[~mask].any() and not roll.entropy[~mask].any()
    assert (roll.entropy[mask] > 0).all()


def test_bf16_products_in_the_rollout_stay_within_the_stated_bounds():
    """`SamplerSettings(product_dtype=torch.bfloat16)` (the CPU default where bf16 products are native: the layers'
    projections and the streamed 40,960-entry head in bf16): every kept log-prob within 0.1 nats of an fp32
    forward's at the same token, E = π W within 5 % and H within 0.1 nats (`streamed_head.draw_from_head` states the
    bounds); all 0 after each stop token. (It samples from that nearby policy, so not always the fp32 path's
    tokens: the fp32 path is the one that must match HF's tokens exactly, tested above.)"""
    from grpo_kit.engine.choice import head_moments

    model = lora_gemma3_streamed_vocabulary()
    roll = rollout_with_early_stops(model, product_dtype=torch.bfloat16)
    mask = roll.completion_mask.bool()
    assert 0 < int(mask.sum()) < mask.numel()
    hf = base_of(model)
    logits = completion_logits(hf, roll)
    logp = torch.log_softmax(logits / 0.9, -1).gather(-1, roll.completion_ids.unsqueeze(-1)).squeeze(-1)
    assert (roll.sampling_logprobs.double() - logp)[mask].abs().max() < 0.1
    want = head_moments(logits, hf.lm_head.weight.double(), 0.9)
    error = (roll.head_mean.double() - want.mean_row).norm(dim=-1) / want.mean_row.norm(dim=-1)
    assert error[mask].max() < 0.05 and (roll.entropy.double() - want.entropy)[mask].abs().max() < 0.1
    assert not roll.head_mean[~mask].any() and not roll.sampling_logprobs[~mask].any()


def test_trainer_rollout_multiplies_in_bf16_only_where_nothing_compares_its_logprobs(task, monkeypatch):
    """`GRPOTrainer.products` (`logprobs.plan_products`): the rollout's products in the device default (bf16 on a
    bf16 CPU) when the update takes log π's value from the sampler and compares it with nothing; fp32 under a
    reference pass (β > 0 or `log_kl`), μ > 1, or with `cpu_bf16` off."""
    from grpo_kit.engine.models import build_tiny_tokenizer

    tok, model = build_tiny_tokenizer(), lora_gemma3_streamed_vocabulary()
    cases = (({}, None), ({"log_kl": True}, torch.float32), ({"beta": 0.04}, torch.float32),
             ({"num_iterations": 2}, torch.float32), ({"reuse_sampler_head": False, "log_kl": True}, None),
             ({"cpu_bf16": False}, torch.float32))
    for overrides, want in cases:
        cfg = GRPOConfig(**{"prompts_per_step": 2, "group_size": 4, "micro_batch_size": 4, "max_new_tokens": 4,
                            "log_kl": False, "output_dir": None, **overrides})
        trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(seed=0), cfg)
        assert trainer.products.rollout_product_dtype is want, overrides


@pytest.mark.parametrize("packed", [True, False])
def test_logprobs_from_the_samplers_head_moments_have_the_recomputed_heads_gradients(packed):
    """The update's log-probs from the rollout's head moments (no pass over the head): values and gradients (LoRA)
    equal those of the head recomputed, padding-free and group-shared forwards alike."""
    from grpo_kit.engine.sampling import SampledHead

    model = lora_gemma3_streamed_vocabulary()
    roll = rollout_with_early_stops(model)
    assert not roll.completion_mask.all()
    model.train()
    weights = torch.randn(roll.completion_mask.shape, generator=torch.Generator().manual_seed(2)) * roll.completion_mask
    params = [p for p in model.parameters() if p.requires_grad]
    results = []
    for sampled in (None, SampledHead(roll.sampling_logprobs, roll.head_mean, roll.entropy)):
        logp, entropy = completion_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_ids.shape[1], 0.9,
                                            forward=ForwardOptions(group_size=4, padding_free=packed),
                                            head=HeadOptions(entropy_grad=False), sampled=sampled)
        results.append((logp.detach(), entropy.detach(), torch.autograd.grad((logp * weights).sum(), params)))
    (lp, en, grads), (lp_s, en_s, grads_s) = results
    real = roll.completion_mask.bool()
    assert (lp - lp_s)[real].abs().max() < 1e-4 and (en - en_s)[real].abs().max() < 1e-4
    for a, b in zip(
        grads, grads_s, strict=True
    ):  # float rounding moves them by ~1e-4 of their norm; a 1 % error in E by ~1e-2
        assert (a - b).norm() <= 1e-3 * a.norm() + 1e-7


def streamed_vocabulary_trainer(
    tok: object, reward: object, task: object, **overrides: object
) -> tuple[torch.nn.Module, GRPOTrainer]:
    """A fresh `lora_gemma3_streamed_vocabulary` and a one-reward trainer on it: 2 prompts × G 4, 10 tokens, lr 1e-3."""
    model = lora_gemma3_streamed_vocabulary()
    cfg = GRPOConfig(prompts_per_step=2, group_size=4, micro_batch_size=4, max_new_tokens=10, temperature=0.9,
                     learning_rate=1e-3, warmup_steps=0, log_kl=False, output_dir=None, log_completions=0, **overrides)
    return model, GRPOTrainer(model, tok, [reward], task.prompt_stream(seed=5), cfg)


def test_grpo_step_with_the_samplers_head_moments_equals_recomputing_the_head(task):
    """A trainer step with `reuse_sampler_head` on (the default) and off, from the same LoRA weights: the rollout
    kept the moments only when on; the same tokens, and the same losses, gradient norms and weights after it. (One
    step: over this random model's nearly flat 40,960-way distribution, weights that differ in float rounding
    may already draw a different token at the next step.)"""
    from grpo_kit.engine.models import build_tiny_tokenizer

    tok = build_tiny_tokenizer()

    def token_reward(prompts, completions, completion_ids, **kw):  # noqa: ANN001, ANN003
        # constant on the first prompt: that group is left out of the update (skip_zero_advantage_groups), so the
        # sampler's moments are taken for the rows kept
        return [1.0 if p == prompts[0] else float(sum(i % 7 for i in ids)) / max(1, len(ids))
                for p, ids in zip(prompts, completion_ids, strict=True)]

    runs = []
    for reuse in (True, False):
        model, trainer = streamed_vocabulary_trainer(tok, token_reward, task, reuse_sampler_head=reuse)
        assert trainer.products.reuse_sampler_head is reuse
        kept: list = []

        def keep(*args, kept=kept, rollout=trainer.rollout):  # noqa: ANN002, ANN202
            kept.append(rollout(*args))
            return kept[-1]

        trainer.rollout = keep
        rows = [trainer.train_step()]
        assert len(kept) == 1 and (kept[0].head_mean is not None) is reuse
        runs.append((rows, kept, [p.detach().clone() for p in model.parameters() if p.requires_grad]))
    (rows_on, kept_on, params_on), (rows_off, kept_off, params_off) = runs
    for a, b in zip(kept_on, kept_off, strict=True):
        assert torch.equal(a.completion_ids, b.completion_ids)
    for a, b in zip(rows_on, rows_off, strict=True):
        assert a["reward_std"] > 0 and a["trained_fraction"] == b["trained_fraction"] == 0.5
        for key in ("policy_loss", "grad_norm", "entropy"):
            assert abs(a[key] - b[key]) <= 1e-3 * max(1.0, abs(b[key])), key
    for a, b in zip(params_on, params_off, strict=True):
        assert (a - b).norm() <= 1e-4 * b.norm()


@pytest.mark.parametrize("large_vocabulary", [False, True])  # the plain head, and the fused frozen head (LoRA, 40,960)
def test_sft_loss_with_the_head_on_completion_positions_only_equals_the_padded_one(large_vocabulary):
    from grpo_kit.train.sft import collate, sft_loss

    model = lora_gemma3_streamed_vocabulary() if large_vocabulary else gemma3_sliding()
    vocab = model.config.vocab_size if hasattr(model, "config") else 256
    gen = torch.Generator().manual_seed(0)
    examples = [(torch.randint(3, vocab, (n,), generator=gen).tolist(), p) for n, p in ((9, 4), (14, 6), (5, 2))]
    batch = collate(examples, pad_id=0, bucket=8)

    def loss_and_grads(completion_only_head: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        loss, tokens = sft_loss(model, batch, completion_only_head=completion_only_head)
        loss.backward()
        assert int(tokens) == sum(len(ids) - p for ids, p in examples)
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad and p.grad is not None]

    packed, padded = loss_and_grads(True), loss_and_grads(False)
    assert torch.allclose(packed[0], padded[0], rtol=1e-5, atol=1e-6)
    assert len(packed[1]) == len(padded[1]) > 0
    for a, b in zip(packed[1], padded[1], strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_split_prompts_lays_a_collate_batch_out_as_rollouts_are():
    """`sft.split_prompts`: each prompt ends at column P, its completion starts there; the mask covers exactly the
    real tokens; the same tokens in the same order as the left-padded batch."""
    from grpo_kit.train.sft import collate, split_prompts

    examples = [([5, 6, 7, 8, 9], 2), ([11, 12, 13, 14, 15, 16, 17], 5), ([21, 22, 23], 1)]
    ids, mask, prompt_len = split_prompts(collate(examples, pad_id=0, bucket=8))
    assert prompt_len == 5 and ids.shape == (3, 5 + 3)
    assert ids.tolist() == [[0, 0, 0, 5, 6, 7, 8, 9], [11, 12, 13, 14, 15, 16, 17, 0], [0, 0, 0, 0, 21, 22, 23, 0]]
    assert mask.tolist() == [[0, 0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0], [0, 0, 0, 0, 1, 1, 1, 0]]


@pytest.mark.parametrize("large_vocabulary", [False, True])  # the plain head, and the fused frozen head (LoRA, 40,960)
def test_padding_free_sft_loss_equals_the_padded_one(large_vocabulary):
    """`sft_loss(padding_free=True)` (GRPO's packed forward on the real tokens) against the padded HF forward: the
    same loss, token count and gradients up to float order; with the frozen base weights multiplied in bf16
    (`products`, LoRA only), the loss within 0.02 and the gradients within 3 % (norm of the difference)."""
    from grpo_kit.train.sft import collate, sft_loss

    model = lora_gemma3_streamed_vocabulary() if large_vocabulary else gemma3_sliding()
    vocab = model.config.vocab_size if hasattr(model, "config") else 256
    gen = torch.Generator().manual_seed(0)
    examples = [(torch.randint(3, vocab, (n,), generator=gen).tolist(), p) for n, p in ((9, 4), (14, 6), (5, 2))]
    batch = collate(examples, pad_id=0, bucket=8)

    def loss_and_grads(**kwargs) -> tuple[torch.Tensor, list[torch.Tensor]]:  # noqa: ANN003
        model.zero_grad()
        loss, tokens = sft_loss(model, batch, **kwargs)
        loss.backward()
        assert int(tokens) == sum(len(ids) - p for ids, p in examples)
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad and p.grad is not None]

    packed, padded = loss_and_grads(padding_free=True), loss_and_grads(completion_only_head=False)
    assert torch.allclose(packed[0], padded[0], rtol=1e-5, atol=1e-6)
    assert len(packed[1]) == len(padded[1]) > 0
    for a, b in zip(packed[1], padded[1], strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    if large_vocabulary:
        loss_bf16, grads_bf16 = loss_and_grads(padding_free=True, products=torch.bfloat16)
        assert (loss_bf16 - padded[0]).abs() < 0.02 and not torch.equal(loss_bf16, packed[0])
        for a, b in zip(grads_bf16, padded[1], strict=True):
            assert (a - b).norm() <= 0.03 * b.norm() + 1e-7


def test_sft_trainer_multiplies_frozen_weights_in_bf16_only_where_grpo_does(task, monkeypatch):
    """`SFTConfig.cpu_bf16`: bf16 products on a CPU that has them natively (stood in for here), for an fp32 model;
    the model's own dtype with it off or without such a CPU; a step trains either way."""
    from grpo_kit.engine.cpu import products
    from grpo_kit.engine.models import build_tiny_tokenizer
    from grpo_kit.train.config import SFTConfig
    from grpo_kit.train.sft import SFTTrainer

    model, tok, rows = lora_gemma3_streamed_vocabulary(), build_tiny_tokenizer(), task.demonstrations().select(range(4))

    def trainer(**kwargs) -> SFTTrainer:  # noqa: ANN003
        return SFTTrainer(model, tok, rows, SFTConfig(batch_size=2, steps=1, output_dir=None, **kwargs))

    monkeypatch.setattr(products, "cpu_bf16_products", lambda: False)
    assert trainer().products == torch.float32
    monkeypatch.setattr(products, "cpu_bf16_products", lambda: True)
    assert trainer().products == torch.bfloat16
    assert trainer(cpu_bf16=False).products is None
    row = trainer().train_step()
    assert row["loss"] > 0 and row["tokens"] > 0


def test_head_casts_are_kept_while_the_weight_is_unchanged():
    """`streamed_head.head_casts`: the same bf16 copy (and transpose) for the same unchanged weight; a new one, with the
    new values, once the weight changes in place (an optimizer step), and for another weight."""
    from grpo_kit.engine.cpu.streamed_head import head_casts

    weight = torch.randn(64, 8)
    cast, cast_t = head_casts(weight, torch.bfloat16, transposed=True)
    assert cast.dtype == torch.bfloat16 and torch.equal(cast_t, cast.T) and cast_t.is_contiguous()
    again = head_casts(weight, torch.bfloat16, transposed=True)
    assert again[0] is cast and again[1] is cast_t
    with torch.no_grad():
        weight.add_(1.0)
    moved, _ = head_casts(weight, torch.bfloat16, transposed=True)
    assert moved is not cast and torch.equal(moved, weight.to(torch.bfloat16))
    assert head_casts(weight, torch.float32, transposed=False) == (None, None)
    other = torch.randn(64, 8)
    assert torch.equal(head_casts(other, torch.bfloat16, transposed=False)[0], other.to(torch.bfloat16))


def test_prepacked_products_equal_plain_ones_up_to_summation_order(monkeypatch):
    """Rollouts on the CPU multiply a decode step's rows by weights prepacked once for oneDNN
    (`products.prepack_weight`): the products of `F.linear` up to float summation order. Over a greedy rollout of the
    LoRA Gemma 3 (fused q/k/v and gate/up, o and down): the same tokens and log-probs within 1e-5 as with plain
    products, the prepacked ones taken in decode steps only (a prefill's stay plain); with GRPO_KIT_CPU_PREPACK=0
    none. The head's blocks, prepacked (`streamed_head.head_packs`), are kept while the weight is unchanged. A bf16
    weight where oneDNN has no bf16 kernel (an AVX2-only CPU) stays plain."""
    import torch.nn.functional as F

    from grpo_kit.engine.cpu import products
    from grpo_kit.engine.cpu.streamed_head import DRAW_BLOCK, head_packs

    if not products.cpu_prepacked_products():
        pytest.skip("no oneDNN prepacking on this CPU")
    weight, x = torch.randn(300, 48), torch.randn(5, 48)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        if dtype == torch.bfloat16 and not products.onednn_has_bf16():
            continue  # an AVX2-only CPU: no bf16 kernel to prepack for (below)
        got = products.prepacked_linear(x.to(dtype), products.prepack_weight(weight.to(dtype))).float()
        want = F.linear(x.to(dtype), weight.to(dtype)).float()
        assert (got - want).abs().max() <= tolerance * want.abs().max(), dtype
    assert products.prepack_weight(weight.double()) is None
    # where oneDNN has no bf16 kernel (AVX2 only) a bf16 weight stays plain, as reordering it would raise
    with monkeypatch.context() as patched:
        patched.setattr(products, "onednn_has_bf16", lambda: False)
        assert products.prepack_weight(weight.bfloat16()) is None and products.prepack_weight(weight) is not None

    model = lora_gemma3()
    prompt_ids, prompt_mask, _, _ = grouped_batch()
    shapes = []
    plain_linear = decoder.prepacked_linear
    monkeypatch.setattr(decoder, "prepacked_linear", lambda x, packed, bias=None: shapes.append(tuple(x.shape)) or
                        plain_linear(x, packed, bias))

    def roll() -> object:
        return sample(model, prompt_ids, prompt_mask,
                      SamplerSettings(max_new_tokens=16, greedy=True, product_dtype=torch.float32),
                      stop_ids=[1], pad_id=0, group_size=4)

    packed = roll()
    assert len(shapes) >= 4 * 15 and all(len(s) == 3 and s[0] <= 12 and s[1] == 1 for s in shapes), shapes[:8]
    taken = len(shapes)
    monkeypatch.setenv("GRPO_KIT_CPU_PREPACK", "0")
    plain = roll()
    assert len(shapes) == taken  # none with prepacking off
    assert torch.equal(packed.completion_ids, plain.completion_ids)
    assert (packed.sampling_logprobs - plain.sampling_logprobs).abs().max() < 1e-5
    assert head_packs(torch.randn(2 * DRAW_BLOCK, 8)) is None  # off: plain products

    monkeypatch.delenv("GRPO_KIT_CPU_PREPACK")
    head = torch.randn(2 * DRAW_BLOCK, 8)
    packs = head_packs(head)
    assert len(packs) == 2 and head_packs(head) is packs
    with torch.no_grad():
        head.mul_(2.0)
    moved = head_packs(head)
    assert moved is not packs
    rows = torch.randn(3, 8)
    assert torch.allclose(products.prepacked_linear(rows, moved[1]), rows @ head[DRAW_BLOCK:].T, atol=1e-4)


def test_bf16_base_products_in_the_update_stay_close_to_fp32():
    """The update's padding-free forward with `product_dtype=torch.bfloat16` (frozen base weights multiplied in
    bf16, LoRA and everything else fp32): log-probs within 0.05 nats of fp32's, and the LoRA gradient within 3 % of
    fp32's (norm of the difference, all tensors together; each tensor within 5 %: typically 1–2 %, and one of the
    56 reached 3.1 % on an Intel CPU with AMX), with and without the sampler's head moments."""
    from grpo_kit.engine.sampling import SampledHead

    model = lora_gemma3_streamed_vocabulary()
    roll = rollout_with_early_stops(model)
    model.train()
    weights = torch.randn(roll.completion_mask.shape, generator=torch.Generator().manual_seed(2)) * roll.completion_mask
    params = [p for p in model.parameters() if p.requires_grad]
    real = roll.completion_mask.bool()
    for sampled in (None, SampledHead(roll.sampling_logprobs, roll.head_mean, roll.entropy)):
        results = []
        for dtype in (None, torch.bfloat16):
            logp, _ = completion_logprobs(model, roll.input_ids, roll.attention_mask, roll.prompt_ids.shape[1], 0.9,
                                          forward=ForwardOptions(group_size=4, padding_free=True, product_dtype=dtype),
                                          head=HeadOptions(entropy_grad=False), sampled=sampled)
            assert logp.dtype == torch.float32
            results.append((logp.detach(), torch.autograd.grad((logp * weights).sum(), params)))
        (lp, grads), (lp_bf16, grads_bf16) = results
        assert (lp - lp_bf16)[real].abs().max() < 0.05
        whole, whole_bf16 = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in grads_bf16])
        assert (whole - whole_bf16).norm() <= 0.03 * whole.norm()
        for a, b in zip(grads, grads_bf16, strict=True):
            assert (a - b).norm() <= 0.05 * a.norm() + 1e-7


def test_grpo_step_with_bf16_products_matches_fp32(task, monkeypatch):
    """`GRPOConfig.cpu_bf16` on a CPU with native bf16 products (stood in for here) against off, from the same LoRA
    weights and the same rollout: the same policy loss (its value is the sampler's log-probs), and the gradient
    (as the step left it, clipped) within 3 % in norm and in the norm of the difference. (Not the weights after the
    step: Adam's first step moves every weight by ≈ lr · sign(g), so a gradient entry near 0 flips its weight's
    move on rounding noise.)"""
    from grpo_kit.engine.cpu import products
    from grpo_kit.engine.models import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    monkeypatch.setattr(products, "cpu_bf16_products", lambda: True)

    def token_reward(prompts, completions, completion_ids, **kw):  # noqa: ANN001, ANN003
        return [float(sum(i % 7 for i in ids)) / max(1, len(ids)) for ids in completion_ids]

    shared: list = []
    runs = []
    for bf16 in (False, True):
        _, trainer = streamed_vocabulary_trainer(tok, token_reward, task, cpu_bf16=bf16)
        assert trainer.products.bf16_products is bf16

        def same_rollout(*args, rollout=trainer.rollout):  # noqa: ANN002, ANN202
            if not shared:  # the fp32 run samples; the bf16 run trains on those very tokens and moments
                shared.append(rollout(*args))
            return shared[0]

        trainer.rollout = same_rollout
        grads: list = []

        def step(*args, real=trainer.optimizer.step, grads=grads, params=trainer.params, **kwargs):  # noqa: ANN002, ANN003, ANN202
            grads.append(torch.cat([p.grad.flatten() for p in params]))
            return real(*args, **kwargs)

        trainer.optimizer.step = step
        row = trainer.train_step()
        assert len(grads) == 1
        runs.append((row, grads[0]))
    (row32, grad32), (row16, grad16) = runs
    assert row32["reward_std"] > 0
    assert abs(row32["policy_loss"] - row16["policy_loss"]) <= 1e-6 * max(1.0, abs(row32["policy_loss"]))
    assert abs(row32["grad_norm"] - row16["grad_norm"]) <= 0.03 * row32["grad_norm"]
    assert 0 < (grad32 - grad16).norm() <= 0.03 * grad32.norm()  # not 0: the bf16 products did run


def test_concat_rollouts_pads_prompts_left_and_completions_right():
    """`sampling.concat_rollouts`: rows of two rollouts with different prompt and completion widths in one batch:
    each row's real tokens, masks, log-probs and moments where they were, padding (pad id, mask 0, zeros) around."""
    from grpo_kit.engine.sampling import Rollout, concat_rollouts

    def roll(rows: int, prompt: int, new: int, seed: int) -> Rollout:
        gen = torch.Generator().manual_seed(seed)
        return Rollout(prompt_ids=torch.randint(1, 50, (rows, prompt), generator=gen),
                       prompt_mask=torch.ones(rows, prompt, dtype=torch.long),
                       completion_ids=torch.randint(1, 50, (rows, new), generator=gen),
                       completion_mask=torch.ones(rows, new, dtype=torch.long),
                       sampling_logprobs=-torch.rand(rows, new, generator=gen),
                       truncated=torch.ones(rows, dtype=torch.bool), head_mean=torch.randn(rows, new, 3, generator=gen),
                       entropy=torch.rand(rows, new, generator=gen))

    a, b = roll(2, 5, 8, 0), roll(4, 7, 6, 1)
    joined = concat_rollouts([a, b], pad_id=0)
    assert (
        joined.prompt_ids.shape == (6, 7)
        and joined.completion_ids.shape == (6, 8)
        and joined.head_mean.shape == (6, 8, 3)
    )
    assert torch.equal(joined.prompt_ids[:2, 2:], a.prompt_ids) and not joined.prompt_ids[:2, :2].any()
    assert not joined.prompt_mask[:2, :2].any() and torch.equal(joined.prompt_ids[2:], b.prompt_ids)
    assert torch.equal(joined.completion_ids[2:, :6], b.completion_ids) and not joined.completion_mask[2:, 6:].any()
    assert torch.equal(joined.head_mean[2:, :6], b.head_mean) and not joined.head_mean[2:, 6:].any()
    assert torch.equal(joined.sampling_logprobs[:2], a.sampling_logprobs) and joined.truncated.tolist() == [True] * 6
    assert concat_rollouts([a], pad_id=0) is a
