"""Correctness and speed of the kit's rollout and training forwards on a CUDA GPU (run by hand on a GPU box).

CI has no GPU, so this script checks there what the CPU tests check here, then times the same work as
`python -m tools bench`'s rollout part, on two models: the demo's tiny Gemma 3 (fp32) and a randomly initialised
Gemma 3 with gemma-3-270m's shapes (bf16; 262k vocabulary, sliding-window layers), the latter also under the
kit's default LoRA. Prints one JSON object.

    python -m tools.gpu_check [--repeats 3] [--out result.json]

`--preset gpu-gemma-3-1b --tokenizer DIR` instead times that preset's own SFT step, GRPO step and greedy evaluation
(`preset_times`, for `config.PRESET_TIMES`) on random weights of its model's shapes, with Gemma 3's tokenizer from
DIR (the offline gemma-3-270m build's: the same 262k vocabulary).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, Gemma3TextConfig

from grpo_kit.engine.hub import MODEL_SHAPES
from grpo_kit.engine.logprobs import ForwardOptions, completion_logprobs
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import add_lora, load_model
from grpo_kit.engine.sampling import SamplerSettings, sample

PROMPTS, GROUP, PROMPT_LEN, NEW = 16, 8, 48, 48


def shaped_config(shapes: str) -> Gemma3TextConfig:
    """A Gemma 3 config with the shapes of MODEL_SHAPES entry `shapes` and Gemma 3's sliding window, context and
    special tokens (the stored shapes leave them out)."""
    fields = json.loads((MODEL_SHAPES / shapes / "config.json").read_text())
    fields = {k: v for k, v in fields.items() if k not in ("architectures", "model_type")}
    return Gemma3TextConfig(
        **fields, sliding_window=512, max_position_embeddings=32768, pad_token_id=0, eos_token_id=1, bos_token_id=2
    )


def gemma_270m_shaped(device: torch.device) -> torch.nn.Module:
    config = shaped_config("gemma-3-270m")
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(device, torch.bfloat16).eval()


def grouped_prompts(vocab: int, device: torch.device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, min(vocab, 100), (PROMPTS, PROMPT_LEN), generator=gen)
    mask = torch.ones_like(ids)
    for row in range(PROMPTS):  # left padding of 0–20 tokens
        mask[row, : int(torch.randint(0, 21, (1,), generator=gen))] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return ids.repeat_interleave(GROUP, 0).to(device), mask.repeat_interleave(GROUP, 0).to(device)


def timed(fn: object, repeats: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def correctness(model: torch.nn.Module) -> dict[str, float]:
    """Rows leaving the batch and the padding-free forward, against the fixed-batch sampler and HF's forward
    (full fp32 matmuls: with TF32 the two sides round differently, ~1e-3)."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        return _correctness(model)
    finally:
        torch.set_float32_matmul_precision(precision)


def _correctness(model: torch.nn.Module) -> dict[str, float]:
    device = next(model.parameters()).device
    ids, mask = grouped_prompts(model.config.vocab_size, device)
    ids, mask = ids[:32], mask[:32]
    rolls = [
        sample(model, ids, mask, SamplerSettings(max_new_tokens=24, temperature=1.0, lean=lean),
               stop_ids=list(range(1, 20)), pad_id=0, generator=torch.Generator().manual_seed(4),
               group_size=GROUP)
        for lean in (True, False)
    ]
    out = {"sampler_same_tokens": float(torch.equal(rolls[0].completion_ids, rolls[1].completion_ids)),
           "sampler_logprob_max_diff": float((rolls[0].sampling_logprobs - rolls[1].sampling_logprobs).abs().max()),
           "sampler_rows_finished_by_token_3": float((rolls[1].completion_mask.sum(1) <= 3).float().mean())}
    roll = rolls[1]
    full_ids, full_mask = roll.input_ids, roll.attention_mask
    weights = torch.randn(roll.completion_ids.shape, device=device) * roll.completion_mask
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    results = {}
    for group, packed in ((1, False), (GROUP, True)):
        logp, _ = completion_logprobs(
            model, full_ids, full_mask, ids.shape[1], 0.7,
            forward=ForwardOptions(group_size=group, padding_free=packed)
        )
        results[packed] = (logp.detach(), torch.autograd.grad((logp * weights).sum(), params))
    model.eval()
    real = roll.completion_mask.bool()
    (plain_lp, plain_g), (packed_lp, packed_g) = results[False], results[True]
    out["padding_free_logprob_max_diff"] = float((plain_lp - packed_lp)[real].abs().max())
    out["padding_free_grad_max_rel_diff"] = max(
        float((a - b).norm() / (a.norm() + 1e-12)) for a, b in zip(plain_g, packed_g, strict=True)
    )
    return out


def with_lora(model: torch.nn.Module) -> torch.nn.Module:
    """The model under the kit's default LoRA (r 8 on every projection), B drawn so the adapter does something."""
    model = add_lora(model, ModelConfig(lora=True))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return model.eval()


def lora_checks(model: torch.nn.Module) -> dict[str, float]:
    """LoRA rollouts (adapters applied from their tensors) against HF's forward through peft, fp32 matmuls. With
    a 262k vocabulary, T = 1 inverse-CDF sampling flips at float rounding on a few tokens, so greedy tokens are
    compared, and the sampled tokens' log-probs against the model's own log-probs of those tokens."""
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        device = next(model.parameters()).device
        ids, mask = grouped_prompts(model.config.vocab_size, device)
        greedy = [
            sample(model, ids, mask, SamplerSettings(max_new_tokens=16, greedy=True, lean=lean), stop_ids=[1], pad_id=0,
                   group_size=GROUP)
            for lean in (True, False)
        ]
        roll = sample(model, ids, mask, SamplerSettings(max_new_tokens=16, temperature=1.0), stop_ids=[1], pad_id=0,
                      generator=torch.Generator().manual_seed(0), group_size=GROUP)
        with torch.no_grad():
            scored, _ = completion_logprobs(model, roll.input_ids, roll.attention_mask, ids.shape[1])
        return {
            "greedy_same_tokens": float(torch.equal(greedy[0].completion_ids, greedy[1].completion_ids)),
            "sampled_logprob_vs_scored_max_diff": float(
                ((roll.sampling_logprobs - scored) * roll.completion_mask).abs().max()),
        }
    finally:
        torch.set_float32_matmul_precision(precision)


def rollout_speed(model: torch.nn.Module, repeats: int) -> dict[str, float]:
    device = next(model.parameters()).device
    ids, mask = grouped_prompts(model.config.vocab_size, device)
    tokens = ids.shape[0] * NEW

    def kit(compiled: bool = False) -> None:
        sample(model, ids, mask, SamplerSettings(max_new_tokens=NEW, temperature=1.0, compiled=compiled), stop_ids=[],
               pad_id=0, generator=torch.Generator().manual_seed(0), group_size=GROUP)

    def hf() -> None:
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                       max_new_tokens=NEW, min_new_tokens=NEW, pad_token_id=0)

    kit(), hf()  # warm-up
    first_compiled, _ = timed(lambda: kit(True), 1)
    out = {"compiled_first_rollout_s": first_compiled}
    for name, fn in (("kit", kit), ("hf_generate", hf), ("kit_compiled", lambda: kit(True))):
        median, times = timed(fn, repeats)
        out[f"{name}_tokens_per_s"] = tokens / median
        out[f"{name}_all_s"] = times
    out["kit_speedup"] = out["kit_tokens_per_s"] / out["hf_generate_tokens_per_s"]
    out["kit_compiled_speedup"] = out["kit_compiled_tokens_per_s"] / out["hf_generate_tokens_per_s"]
    return out


def update_speed(model: torch.nn.Module, repeats: int) -> dict[str, float]:
    """Forward + backward of the log-prob forward on sampled completions (mean length as sampled), per mode."""
    device = next(model.parameters()).device
    ids, mask = grouped_prompts(model.config.vocab_size, device)
    roll = sample(model, ids, mask, SamplerSettings(max_new_tokens=NEW, temperature=1.0), stop_ids=list(range(1, 40)),
                  pad_id=0, generator=torch.Generator().manual_seed(1), group_size=GROUP).trimmed()
    full_ids, full_mask = roll.input_ids, roll.attention_mask
    model.train()
    out = {"completion_length_mean": float(roll.completion_mask.sum(1).float().mean()),
           "width": roll.completion_ids.shape[1]}
    for name, group, packed in (("plain", 1, False), ("shared", GROUP, False), ("padding_free", GROUP, True)):
        def step(group: int = group, packed: bool = packed) -> None:
            logp, _ = completion_logprobs(
                model, full_ids, full_mask, ids.shape[1], 1.0,
                forward=ForwardOptions(group_size=group, padding_free=packed)
            )
            logp.sum().backward()
            model.zero_grad(set_to_none=True)

        step()
        out[f"{name}_s"], _ = timed(step, repeats)
    model.eval()
    return out


def trainer_steps(steps: int) -> dict[str, object]:
    """The demo's GRPO settings on the tiny Gemma, on the GPU, with the defaults (compiled sampler on CUDA)."""
    from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
    from grpo_kit.data.tasks import ArithmeticTask
    from grpo_kit.train.config import load_run_config
    from grpo_kit.train.grpo import GRPOTrainer

    cfg = load_run_config("cpu-tiny")
    model, tokenizer = load_model(cfg.model, torch.device("cuda"))
    grpo = cfg.grpo
    grpo.output_dir, grpo.log_completions, grpo.reward_weights = None, 0, grpo.reward_weights or DEFAULT_WEIGHTS
    trainer = GRPOTrainer(model, tokenizer, DEFAULT_REWARDS, ArithmeticTask().prompt_stream(seed=1), grpo)
    rows = [trainer.train_step() for _ in range(steps)]
    return {"compile_sampler": trainer.sampler.compiled, "step_s": [round(r["step_seconds"], 3) for r in rows],
            "rollout_s": [round(r["rollout_seconds"], 3) for r in rows],
            "reward_mean": [round(r["reward_mean"], 3) for r in rows]}


def random_model_dir(shapes: str, tokenizer_dir: str, out: Path) -> Path:
    """A transformers directory with random weights of `shapes` (a MODEL_SHAPES entry; no hub on a GPU box) and the
    tokenizer of `tokenizer_dir`, so `load_model` loads it as it loads any checkpoint (LoRA, checkpointing, dtype)."""
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(shaped_config(shapes)).to(torch.bfloat16).save_pretrained(out)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out)
    return out


def preset_times(preset: str, tokenizer_dir: str, *, steps: int, sft_steps: int, device: str = "cuda",
                 dtype: str | None = None) -> dict[str, object]:
    """`preset`'s SFT step, GRPO step and greedy evaluation of 200 problems on the GPU, its model's shapes with
    random weights. The prompts are the generated word problems (no dataset on a GPU box either); random weights
    rarely sample an end token, so every completion runs to max_new_tokens: the longest step the preset can take.
    `dtype`: the model's, instead of the preset's (`float32` is a T4's path: it has no bf16)."""
    import tempfile
    from dataclasses import replace

    from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
    from grpo_kit.data.tasks import make_task
    from grpo_kit.eval.evaluation import Batching, evaluate
    from grpo_kit.train.config import load_run_config
    from grpo_kit.train.grpo import GRPOTrainer
    from grpo_kit.train.sft import SFTTrainer

    cfg = load_run_config(preset)
    task = make_task(load_run_config("cpu-gemma-270m").task)
    with tempfile.TemporaryDirectory() as tmp:
        path = random_model_dir(cfg.model.name.rsplit("/", 1)[-1], tokenizer_dir, Path(tmp) / "model")
        model, tokenizer = load_model(replace(cfg.model, name=str(path), dtype=dtype or cfg.model.dtype),
                                      torch.device(device))
    sft = SFTTrainer(model, tokenizer, task.demonstrations(), replace(cfg.sft, output_dir=None))
    sft_s = [timed(sft.train_step, 1)[0] for _ in range(sft_steps + 1)][1:]
    grpo = replace(cfg.grpo, output_dir=None, log_completions=0,
                   reward_weights=cfg.grpo.reward_weights or DEFAULT_WEIGHTS)
    trainer = GRPOTrainer(model, tokenizer, DEFAULT_REWARDS, task.prompt_stream(), grpo)
    rows = [trainer.train_step() for _ in range(steps + 1)]
    batching = Batching(size=cfg.eval_batch_size, prompt_bucket=grpo.prompt_bucket)
    eval_s, _ = timed(lambda: evaluate(model, tokenizer, task.test_set(), max_new_tokens=grpo.max_new_tokens,
                                       batching=batching), 1)
    return {"preset": preset, "model_shapes": cfg.model.name, "dtype": str(next(model.parameters()).dtype),
            "sft_step_s": [round(t, 3) for t in sft_s], "sft_batch": cfg.sft.batch_size,
            "grpo_first_step_s": round(rows[0]["step_seconds"], 2),
            "grpo_step_s": [round(r["step_seconds"], 2) for r in rows[1:]],
            "rollout_s": [round(r["rollout_seconds"], 2) for r in rows[1:]],
            "completion_length": [round(r["completion_length_mean"], 1) for r in rows[1:]],
            "prompts": grpo.prompts_per_step, "group": grpo.group_size, "max_new_tokens": grpo.max_new_tokens,
            "eval_200_greedy_s": round(eval_s, 1), "compile_sampler": trainer.sampler.compiled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=None)
    parser.add_argument("--trainer-steps", type=int, default=8)
    parser.add_argument("--preset", default=None, help="time this preset's steps instead (see the module docstring)")
    parser.add_argument("--tokenizer", default=None, help="with --preset: a directory holding Gemma 3's tokenizer")
    parser.add_argument("--dtype", default=None, help="with --preset: the model's dtype (default: the preset's)")
    args = parser.parse_args()
    if args.preset:
        if not args.tokenizer:
            parser.error("--preset needs --tokenizer DIR (Gemma 3's tokenizer)")
        _emit(preset_times(args.preset, args.tokenizer, steps=args.trainer_steps, sft_steps=args.repeats,
                           dtype=args.dtype), args.out)
        return
    device = torch.device("cuda")
    tiny, _ = load_model(ModelConfig(), device)
    big = gemma_270m_shaped(device)
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tiny": {"dtype": str(tiny.dtype), "checks_fp32": correctness(copy.deepcopy(tiny).float()),
                 "checks": correctness(tiny), "rollouts": rollout_speed(tiny, args.repeats),
                 "update": update_speed(tiny, args.repeats)},
        "trainer": trainer_steps(args.trainer_steps),
        "gemma_270m_shaped_bf16": {"rollouts": rollout_speed(big, args.repeats),
                                   "update": update_speed(big, args.repeats)},
    }
    del big
    result["gemma_270m_shaped_lora"] = {
        "checks_fp32": lora_checks(with_lora(gemma_270m_shaped(device).float())),
        "rollouts_bf16": rollout_speed(with_lora(gemma_270m_shaped(device)), args.repeats)}
    _emit(result, args.out)


def _emit(result: dict[str, object], out: str | None) -> None:
    text = json.dumps(result, indent=1)
    print(text)
    if out:
        with open(out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
