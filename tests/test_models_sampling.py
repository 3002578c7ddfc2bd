import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_kit.data.chat import GEMMA_CHAT_TEMPLATE, stop_token_ids
from grpo_kit.engine.choice import choose_tokens, head_moments, inverse_cdf
from grpo_kit.engine.cpu.streamed_head import HeadWeights, draw_from_head
from grpo_kit.engine.logprobs import completion_logprobs
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import (
    MODEL_SHAPES,
    TINY_CONFIG,
    ReferencePolicy,
    build_tiny_tokenizer,
    count_parameters,
    load_model,
    merge_and_restart_lora,
)
from grpo_kit.engine.sampling import SamplerSettings, encode_prompts, sample

ROOT = Path(__file__).resolve().parent.parent


def test_committed_tiny_gemma_files_match_the_script(tmp_path):
    subprocess.run(
        [sys.executable, "-c", f"from grpo_kit.engine.models import write_tiny_gemma_files as w; w({str(tmp_path)!r})"],
        check=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).read_text() == (MODEL_SHAPES / "tiny-gemma" / name).read_text(), name
    assert json.loads((MODEL_SHAPES / "tiny-gemma" / "config.json").read_text()) == TINY_CONFIG


def test_tiny_gemma_is_a_real_gemma3_with_gemma_tokens(tiny):
    model, tok = tiny
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert 0.5e6 < count_parameters(model)["total"] < 2e6
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied, as in Gemma
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, 2)
    assert stop_token_ids(tok) == [1, tok.convert_tokens_to_ids("<end_of_turn>")]
    text = tok.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "What is 1 + 2?"},
                                    {"role": "assistant", "content": "3"}], tokenize=False)
    assert text == "<bos><start_of_turn>user\nS\n\nWhat is 1 + 2?<end_of_turn>\n<start_of_turn>model\n3<end_of_turn>\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert tok.chat_template == GEMMA_CHAT_TEMPLATE
    assert len(build_tiny_tokenizer()) == TINY_CONFIG["vocab_size"]


def test_seeded_init_is_reproducible(cpu):
    a, _ = load_model(ModelConfig(seed=3), cpu)
    b, _ = load_model(ModelConfig(seed=3), cpu)
    c, _ = load_model(ModelConfig(seed=4), cpu)
    assert torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


def _adapter(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_lora_adapters_come_from_the_seed_not_the_process_state(cpu):
    """A LoRA adapter's random A matrices, and the fresh adapter GRPO and its controls start from, are drawn from
    ModelConfig.seed: two processes with the same seed train the same run. The process's random state is untouched."""
    def loaded(seed: int, process_state: int) -> torch.nn.Module:
        torch.manual_seed(process_state)
        before = torch.get_rng_state()
        model, _ = load_model(ModelConfig(seed=seed, lora=True), cpu)
        assert torch.equal(torch.get_rng_state(), before)
        return model

    def restarted(model: torch.nn.Module, process_state: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(process_state)
        return _adapter(merge_and_restart_lora(model, ModelConfig(seed=3, lora=True)))

    first_model, second_model = loaded(3, 111), loaded(3, 222)
    first, second, other_seed = _adapter(first_model), _adapter(second_model), _adapter(loaded(4, 111))
    fresh_first, fresh_second = restarted(first_model, 112), restarted(second_model, 223)
    assert first and first.keys() == second.keys() == other_seed.keys()
    assert any("lora_A" in name and p.abs().sum() > 0 for name, p in first.items())
    assert all(torch.equal(first[n], second[n]) for n in first)
    assert all(torch.equal(fresh_first[n], fresh_second[n]) for n in fresh_first)
    assert not all(torch.equal(first[n], other_seed[n]) for n in first if "lora_A" in n)


def test_prompts_are_left_padded_to_a_bucket(tiny, task):
    _, tok = tiny
    ids, mask = encode_prompts(tok, list(task.test_set()["prompt"][:5]), bucket=16)
    assert ids.shape[1] % 16 == 0 and ids.shape == mask.shape
    assert (mask[:, -1] == 1).all() and (ids[mask == 0] == tok.pad_token_id).all()


def test_greedy_sampler_equals_hf_generate(sft_model, task):
    model, tok = sft_model
    prompts = list(task.test_set()["prompt"][:6])
    ids, mask = encode_prompts(tok, prompts, bucket=16)
    roll = sample(model, ids, mask, SamplerSettings(max_new_tokens=24, greedy=True), stop_ids=stop_token_ids(tok),
                  pad_id=tok.pad_token_id)
    ref = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=24, do_sample=False,
                         eos_token_id=stop_token_ids(tok), pad_token_id=tok.pad_token_id)[:, ids.shape[1]:]
    n = ref.shape[1]
    assert torch.equal(roll.completion_ids[:, :n], ref)
    assert len({tuple(r.tolist()) for r in ref}) > 1


def test_stop_tokens_mask_everything_after(tiny, task):
    model, tok = tiny
    ids, mask = encode_prompts(tok, list(task.test_set()["prompt"][:8]), bucket=16)
    stops = stop_token_ids(tok)
    # make <end_of_turn> likely so some rows stop early
    with torch.no_grad():
        model.lm_head.weight[stops[1]] += 0.3 * model.lm_head.weight.mean(0)
    roll = sample(model, ids, mask, SamplerSettings(max_new_tokens=20, temperature=1.0), stop_ids=stops,
                  pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    for row in range(8):
        comp, m = roll.completion_ids[row], roll.completion_mask[row]
        hits = [i for i, t in enumerate(comp.tolist()) if t in stops]
        if hits:
            first = hits[0]
            assert m[: first + 1].all() and not m[first + 1 :].any()
            assert (comp[first + 1 :] == tok.pad_token_id).all() and not roll.truncated[row]
        else:
            assert m.all() and roll.truncated[row]
    assert roll.completion_ids.shape == (8, 20)  # fixed shape however early rows stop


def test_sampling_logprobs_match_the_training_forward(sft_model, task):
    model, tok = sft_model
    ids, mask = encode_prompts(tok, list(task.test_set()["prompt"][:4]), bucket=16)
    roll = sample(model, ids, mask, SamplerSettings(max_new_tokens=12, temperature=0.8), stop_ids=stop_token_ids(tok),
                  pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logp, entropy = completion_logprobs(model, roll.input_ids, roll.attention_mask, ids.shape[1], temperature=0.8)
    m = roll.completion_mask.bool()
    assert torch.allclose(logp[m], roll.sampling_logprobs[m], atol=1e-4)
    assert (entropy[m] > 0).all()


def test_choose_tokens_filters():
    logits = torch.tensor([[5.0, 4.0, 1.0, 0.0]]).repeat(2000, 1)
    torch.manual_seed(0)
    tokens, _ = choose_tokens(logits, 1.0, top_k=2)
    assert set(tokens.tolist()) == {0, 1}
    p = torch.softmax(logits[0], -1)  # p0 = .71, p0+p1 = .97
    tokens, _ = choose_tokens(logits, 1.0, top_p=0.5)
    assert set(tokens.tolist()) == {0}
    tokens, logp = choose_tokens(logits, 1.0)
    assert abs((tokens == 0).float().mean().item() - p[0].item()) < 0.04
    assert torch.allclose(logp[tokens == 0], torch.log(p[0]).expand((tokens == 0).sum()), atol=1e-5)
    greedy, _ = choose_tokens(logits[:1], 1.0, greedy=True)
    assert greedy.item() == 0


@pytest.mark.parametrize("vocab", [5, 106, 512, 1000, 262_144])
def test_two_level_inverse_cdf_picks_what_one_prefix_sum_picks(vocab):
    """The block search equals the textbook inverse CDF (one prefix sum over the vocabulary, in float64 so that
    rounding cannot decide), for vocabularies smaller than, equal to and many times a block (Gemma's 262k)."""
    torch.manual_seed(vocab)
    probs = torch.softmax(torch.randn(64, vocab) * 3, -1)
    u = torch.rand(64)
    wide = probs.double()
    expected = (wide.cumsum(-1) < (u.double() * wide.sum(-1)).unsqueeze(-1)).sum(-1).clamp(max=vocab - 1)
    assert torch.equal(inverse_cdf(probs, u), expected)
    assert torch.equal(inverse_cdf(probs.view(8, 8, vocab), u.view(8, 8)), expected.view(8, 8))


@pytest.mark.parametrize("prepacked", [False, True])
@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("greedy", [False, True])
def test_streaming_the_head_through_the_draw_picks_what_the_full_logits_pick(softcap, greedy, prepacked):
    """`draw_from_head` (the LM head block by block inside the draw) against `choose_tokens` on the whole logits:
    320 draws over a 65,536-entry vocabulary with peaked and flat rows; same tokens, log-probs within 1e-4; also
    with the head's blocks prepacked for oneDNN (`head_packs`, as a CPU rollout passes them)."""
    from grpo_kit.engine.cpu.streamed_head import head_packs

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(65_536, 32, generator=gen)
    hidden = torch.randn(64, 32, generator=gen) * torch.linspace(0.05, 1.5, 64).unsqueeze(1)  # flat … peaked rows
    logits = hidden @ weight.T
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    tokens, logprobs, full_tokens, full_logprobs = [], [], [], []
    for _ in range(1 if greedy else 5):
        u = torch.rand(64, generator=gen)
        packs = head_packs(weight) if prepacked else None
        if prepacked and packs is None:
            pytest.skip("no oneDNN prepacking on this CPU")
        got = draw_from_head(hidden, HeadWeights(weight, packs=packs), temperature=0.8, softcap=softcap, greedy=greedy,
                             uniforms=u)
        want = choose_tokens(logits, 0.8, greedy=greedy, uniforms=u)
        tokens.append(got[0]), logprobs.append(got[1]), full_tokens.append(want[0]), full_logprobs.append(want[1])
    assert torch.equal(torch.cat(tokens), torch.cat(full_tokens))
    assert torch.allclose(torch.cat(logprobs), torch.cat(full_logprobs), atol=1e-4)
    assert len(set(torch.cat(tokens).tolist())) > (40 if not greedy else 20)  # the draws are spread, not one token


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_bf16_head_products_keep_the_draw_within_the_stated_bounds(softcap):
    """`draw_from_head` given a bf16 copy of the head (what the CPU sampler multiplies in on a CPU with native bf16
    products) against the fp32 policy on the whole logits (up to ≈ 18), peaked and flat rows over 65,536 entries:
    the policies within KL 2e-3, each drawn token's log-prob within 0.1 nats of its fp32 log-prob, greedy picks
    equal wherever the best two logits are 0.1 apart, E = π W within 5 % and H within 0.1 nats. (On a CPU
    without native bf16 this runs emulated: slower, same numbers.)"""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(65_536, 64, generator=gen) * 0.3
    hidden = torch.randn(64, 64, generator=gen) * torch.linspace(0.05, 1.5, 64).unsqueeze(1)
    temperature, moments = 0.8, softcap is None

    def capped(z: torch.Tensor) -> torch.Tensor:
        return torch.tanh(z / softcap) * softcap if softcap else z

    logits = capped(hidden @ weight.T)
    assert 15 < logits.abs().max() < 25
    logp = torch.log_softmax(logits / temperature, -1)
    logp_bf16 = torch.log_softmax(capped((hidden.bfloat16() @ weight.bfloat16().T).float()) / temperature, -1)
    assert (logp.exp() * (logp - logp_bf16)).sum(-1).max() < 2e-3
    for _ in range(5):
        u = torch.rand(64, generator=gen)
        tokens, logprobs, found = draw_from_head(hidden, HeadWeights(weight.bfloat16()), temperature=temperature,
                                                 softcap=softcap, greedy=False, uniforms=u, moments=moments)
        assert (logprobs - logp.gather(1, tokens.unsqueeze(1)).squeeze(1)).abs().max() < 0.1
    tokens, _, found = draw_from_head(hidden, HeadWeights(weight.bfloat16()), temperature=temperature, softcap=softcap,
                                      greedy=True, uniforms=None, moments=moments)
    best_two = logits.topk(2, dim=-1).values
    clear = best_two[:, 0] - best_two[:, 1] > 0.1
    assert clear.sum() > 30 and torch.equal(tokens[clear], logits.argmax(-1)[clear])
    if moments:
        want = head_moments(logits, weight, temperature)
        error = (found.mean_row - want.mean_row).norm(dim=-1) / want.mean_row.norm(dim=-1)
        assert error.max() < 0.05 and (found.entropy - want.entropy).abs().max() < 0.1


def test_the_exp_floor_keeps_subnormals_out_and_changes_no_draw(monkeypatch):
    """Rows whose logits span hundreds within a block would give e^{z − m_b} below fp32's smallest normal (subnormals,
    slow on x86): with EXP_FLOOR they are 1.6e-38 instead, and the tokens, log-probs and moments are those of the
    draw without the floor."""
    from grpo_kit.engine.cpu import streamed_head

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(2 * streamed_head.DRAW_BLOCK, 32, generator=gen)
    hidden = torch.randn(16, 32, generator=gen) * torch.linspace(2.0, 8.0, 16).unsqueeze(1)
    z = (hidden / 0.8) @ weight.T
    tiny = torch.finfo(torch.float32).tiny
    # without the floor, subnormals (in float64: importing grpo_kit makes the CPU flush fp32 subnormals to zero,
    # `products.flush_denormals`, where the CPU can; the floor keeps them out where it cannot)
    exact = torch.exp((z - z.amax(1, keepdim=True)).double())
    assert ((exact > 0) & (exact < tiny)).any()
    u = torch.rand(16, generator=gen)
    floored = draw_from_head(hidden, HeadWeights(weight), temperature=0.8, softcap=None, greedy=False, uniforms=u,
                             moments=True)
    monkeypatch.setattr(streamed_head, "EXP_FLOOR", float("-inf"))
    unfloored = draw_from_head(hidden, HeadWeights(weight), temperature=0.8, softcap=None, greedy=False, uniforms=u,
                               moments=True)
    assert torch.equal(floored[0], unfloored[0]) and torch.equal(floored[1], unfloored[1])
    assert torch.allclose(floored[2].mean_row, unfloored[2].mean_row, rtol=1e-6, atol=1e-6)
    assert torch.allclose(floored[2].entropy, unfloored[2].entropy, rtol=1e-6, atol=1e-6)


def test_the_moments_leave_out_only_tiles_without_mass_and_the_draw_is_unchanged(monkeypatch):
    """`draw_from_head(moments=True)` takes the moments' product only over the SAMPLE_BLOCK-entry tiles holding at
    least MOMENT_FLOOR of some row's mass: on peaked rows (all mass on 8 entries of the first of four 16,384-entry
    blocks) at most 8 of the 128 tiles, the tokens and log-probs are exactly those with every tile taken, and
    E = π W and H differ by no more than the left-out mass allows (≤ 128 · 2⁻²⁵ of the largest head row); flat rows
    need every tile."""
    from grpo_kit.engine.cpu import streamed_head

    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(4 * streamed_head.DRAW_BLOCK, 32, generator=gen)
    tiles = weight.shape[0] // streamed_head.SAMPLE_BLOCK
    # each peaked row points at one of block 0's longest rows of W, so no other entry's logit comes near its own
    targets = weight[: streamed_head.DRAW_BLOCK].norm(dim=1).topk(8).indices
    peaked = weight[targets] * 6.0
    flat = torch.randn(8, 32, generator=gen) * 0.05
    taken = []
    head_mean = streamed_head._head_mean

    def counting(weight, exps, per_mass, kept, *, weight_t):
        taken.append(kept.nonzero().flatten().tolist())
        return head_mean(weight, exps, per_mass, kept, weight_t=weight_t)

    monkeypatch.setattr(streamed_head, "_head_mean", counting)
    peaked_tiles = sorted(set((targets // streamed_head.SAMPLE_BLOCK).tolist()))
    for hidden, want_tiles in ((peaked, peaked_tiles), (flat, list(range(tiles)))):
        u = torch.rand(hidden.shape[0], generator=gen)
        tokens, logprobs, found = draw_from_head(hidden, HeadWeights(weight), temperature=0.8, softcap=None,
                                                 greedy=False, uniforms=u, moments=True)
        assert taken.pop() == want_tiles
        monkeypatch.setattr(streamed_head, "MOMENT_FLOOR", 0.0)
        all_tokens, all_logprobs, every = draw_from_head(hidden, HeadWeights(weight), temperature=0.8, softcap=None,
                                                         greedy=False, uniforms=u, moments=True)
        monkeypatch.undo()
        monkeypatch.setattr(streamed_head, "_head_mean", counting)
        assert taken.pop() == list(range(tiles))
        assert torch.equal(tokens, all_tokens) and torch.equal(logprobs, all_logprobs)
        bound = tiles * 2.0**-25 * weight.norm(dim=1).max()
        assert (found.mean_row - every.mean_row).norm(dim=1).max() <= bound
        assert (found.entropy - every.entropy).abs().max() <= bound * hidden.norm(dim=1).max() / 0.8 + 1e-5
        want = head_moments(hidden @ weight.T, weight, 0.8)
        assert torch.allclose(every.mean_row, want.mean_row, rtol=1e-4, atol=1e-4)
        # the same runs of tiles through Wᵀ (`head_casts(transposed=True)`, as a rollout passes it)
        _, _, through_t = draw_from_head(hidden, HeadWeights(weight, weight.T.contiguous()), temperature=0.8,
                                         softcap=None, greedy=False, uniforms=u, moments=True)
        assert taken.pop() == want_tiles
        assert torch.allclose(through_t.mean_row, found.mean_row, rtol=1e-5, atol=1e-6)


def test_kept_runs_split_at_gaps_and_block_ends():
    """`_kept_runs` gives one product per run of consecutive kept tiles, never across a block's end (each block has
    its own scale)."""
    from grpo_kit.engine.cpu.streamed_head import _kept_runs

    kept = [True, True, False, True, True, True, True, False]
    assert _kept_runs(kept, per_block=4) == [(0, 2), (3, 4), (4, 7)]
    assert _kept_runs(kept, per_block=8) == [(0, 2), (3, 7)]
    assert _kept_runs([False] * 4, per_block=2) == []


def test_product_dtype_follows_the_cpus_bf16_support(monkeypatch):
    """bf16 products for an fp32 CPU head only where bf16 is the faster: AMX tiles, or AVX512-BF16 on an AMD CPU
    (an Intel one without AMX stays fp32, as does one without AVX512-BF16), and GRPO_KIT_CPU_BF16 is not 0; a bf16
    head stays bf16."""
    from grpo_kit.engine.cpu import products

    fp32, bf16 = torch.zeros(4, 2), torch.zeros(4, 2, dtype=torch.bfloat16)
    cases = (  # AMX, AVX512-BF16, vendor, GRPO_KIT_CPU_BF16 → the product dtype
        (False, True, "AuthenticAMD", "1", torch.bfloat16), (False, True, "AuthenticAMD", "0", torch.float32),
        (False, True, "GenuineIntel", "1", torch.float32), (True, True, "GenuineIntel", "1", torch.bfloat16),
        (True, True, "GenuineIntel", "0", torch.float32), (False, False, "AuthenticAMD", "1", torch.float32),
        (False, True, "", "1", torch.float32))
    for amx, native, vendor, flag, want in cases:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda native=native: native)
        monkeypatch.setattr(products, "cpu_vendor", lambda vendor=vendor: vendor)
        monkeypatch.setenv("GRPO_KIT_CPU_BF16", flag)
        assert products.product_dtype(fp32) == want and products.product_dtype(bf16) == torch.bfloat16, (amx, vendor)


def test_reference_policy_frozen_copy_and_lora(cpu):
    model, _ = load_model(ModelConfig(), cpu)
    ref = ReferencePolicy(model)
    with ref.model() as r:
        assert r is not model and not any(p.requires_grad for p in r.parameters())
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)
    ref.ema_update(0.5)
    assert torch.allclose(ref.frozen.model.norm.weight, model.model.norm.weight - 0.5)
    lora, _ = load_model(ModelConfig(lora=True, lora_r=4), cpu)
    counts = count_parameters(lora)
    assert 0 < counts["trainable"] < counts["total"] / 5
    ref = ReferencePolicy(lora)
    assert ref.frozen is None  # adapter disabled, no second copy
    with pytest.raises(ValueError, match="EMA"):
        ref.ema_update(0.1)


@pytest.mark.parametrize(("bf16", "capability", "triton", "dtype", "compiles"), [
    (True, (9, 0), True, torch.bfloat16, True),     # H100
    (False, (7, 5), True, torch.float32, True),     # T4: no bf16 → fp32 (Gemma NaNs in fp16), Triton runs
    (False, (6, 0), True, torch.float32, False),    # P100: Triton needs compute capability ≥ 7.0
    (True, (8, 0), False, torch.bfloat16, False),   # no triton package: eager sampler
])
def test_gpu_dtype_and_compile_follow_what_the_gpu_supports(monkeypatch, bf16, capability, triton, dtype, compiles):
    from grpo_kit.engine import device as device_module

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setitem(sys.modules, "triton", object() if triton else None)
    cuda = torch.device("cuda")
    assert device_module.default_dtype(cuda) == dtype and device_module.resolve_dtype("auto", cuda) == dtype
    assert device_module.compile_supported(cuda) is compiles
    assert device_module.default_dtype(torch.device("cpu")) == torch.float32
    assert not device_module.compile_supported(torch.device("cpu"))


def test_a_batch_the_mesh_cannot_split_is_padded_and_trimmed(monkeypatch, sft_model, task):
    """Under SPMD every device takes an equal share of the rows: 3 prompts on 4 devices become 4 rows (the last
    prompt twice), and only the 3 asked for come back, each as it would alone."""
    import grpo_kit.engine.sampling as sampling
    from grpo_kit.eval.evaluation import generate_completions

    model, tokenizer = sft_model
    prompts = [row["prompt"] for row in task.test_set().select(range(3))]
    alone = [generate_completions(model, tokenizer, [p], max_new_tokens=12)[0] for p in prompts]
    seen = []
    real_sample = sampling.sample

    def spy(model, prompt_ids, *args, **kwargs):
        seen.append(prompt_ids.shape[0])
        return real_sample(model, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(sampling, "padded_rows", lambda rows, device: -(-rows // 4) * 4)
    monkeypatch.setattr(sampling, "sample", spy)
    import grpo_kit.engine.sampler as seam

    monkeypatch.setattr(seam, "sample", spy)
    assert generate_completions(model, tokenizer, prompts, max_new_tokens=12) == alone
    assert seen == [3, 4]  # asked with 3 rows, sampled with 4


def test_the_sampler_seam_gives_the_engines_tokens_and_log_probs(sft_model, task):
    """`Sampler.generate` is `sample` on the prompts it encodes (the same tokens from the same noise, the all-padding
    tail dropped on the CPU), and `Sampler.logprobs` is the training forward's log-probs of those tokens."""
    from grpo_kit.engine.sampler import Sampler

    model, tok = sft_model
    prompts = list(task.test_set()["prompt"][:4])
    settings = SamplerSettings(max_new_tokens=12, temperature=0.8, prompt_bucket=16)
    roll = Sampler(model, tok, settings, group_size=2, generator=torch.Generator().manual_seed(0)).generate(prompts)
    ids, mask = encode_prompts(tok, prompts, bucket=16)
    ids, mask = ids.repeat_interleave(2, 0), mask.repeat_interleave(2, 0)
    direct = sample(model, ids, mask, SamplerSettings(max_new_tokens=12, temperature=0.8), stop_ids=stop_token_ids(tok),
                    pad_id=tok.pad_token_id, generator=torch.Generator().manual_seed(0), group_size=2)
    width = roll.completion_ids.shape[1]
    assert width <= 12 and torch.equal(roll.completion_ids, direct.completion_ids[:, :width])
    assert not direct.completion_mask[:, width:].any()  # only padding was dropped
    sampler = Sampler(model, tok, settings, group_size=2)
    with torch.no_grad():
        logp, _ = sampler.logprobs(roll)
        plain, _ = completion_logprobs(model, roll.input_ids, roll.attention_mask, ids.shape[1], temperature=0.8)
        first, _ = sampler.logprobs(roll, slice(0, 2))
    m = roll.completion_mask.bool()
    assert torch.allclose(logp[m], plain[m], atol=1e-5)
    assert torch.allclose(logp[m], roll.sampling_logprobs[m], atol=1e-4)
    assert torch.allclose(first, logp[:2], atol=1e-5)


def test_grpo_rft_and_evaluation_sample_through_the_one_seam_and_rft_compiles_where_grpo_does(tiny, task, monkeypatch):
    """Every rollout of the package goes through `engine.sampler.Sampler`; where `torch.compile` runs (forced here,
    without running it) GRPO's and RFT's samplers both compile."""
    import grpo_kit.engine.sampler as seam
    from grpo_kit import RFTConfig, RFTTrainer
    from grpo_kit.data.rewards import DEFAULT_REWARDS
    from grpo_kit.eval.evaluation import generate_completions
    from grpo_kit.train.config import GRPOConfig
    from grpo_kit.train.grpo import GRPOTrainer

    model, tok = tiny
    calls = []
    real_sample = seam.sample
    monkeypatch.setattr(seam, "sample", lambda *a, **k: calls.append(a[3].compiled) or real_sample(*a, **k))
    generate_completions(model, tok, list(task.test_set()["prompt"][:2]), max_new_tokens=4)
    rft = RFTTrainer(model, tok, task.prompt_stream(seed=0), RFTConfig(steps=1, prompts_per_step=2, group_size=2,
                                                                        max_new_tokens=4, output_dir=None))
    rft.train()
    assert len(calls) >= 2 and not any(calls)  # evaluation, then RFT: each through the seam, uncompiled on a CPU
    monkeypatch.setattr(seam, "compile_supported", lambda device: True)
    grpo = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(seed=0), GRPOConfig(output_dir=None))
    rft = RFTTrainer(model, tok, task.prompt_stream(seed=0), RFTConfig(output_dir=None))
    assert grpo.sampler.compiled and rft.sampler.compiled
