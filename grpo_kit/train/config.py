"""Configuration: one documented dataclass per trainer and named presets.

Every field says its default and why. Presets are plain dicts of overrides, so a preset is
readable in one glance and a YAML file can hold the same keys.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from .. import options
from ..algo.advantages import CLIP_MODES, ESTIMATORS
from ..algo.losses import IMPORTANCE_SAMPLING_LEVELS, KL_ESTIMATORS, LOSSES, LossSpec
from ..engine.model_config import ModelConfig
from ..validation import ConfigError, Rule, above, at_least, one_of, ruled, subset_of, validate, within

STEP_COUNTS: Rule = (lambda v: len(v) > 0 and all(2 <= n <= 4 for n in v), "a non-empty list of 2, 3 or 4")
"""The rule of a word-problem task's step counts."""


def field_docs(config_class: type) -> dict[str, str]:
    """Each field's documentation: the string written under it in the class body (the docstring convention every
    config class here follows), read from the source, parent classes first; a field with none is absent."""
    docs: dict[str, str] = {}
    for cls in reversed(config_class.__mro__[:-1]):
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
        except (OSError, TypeError):
            continue
        for field_node, doc in itertools.pairwise(body):
            if (
                isinstance(field_node, ast.AnnAssign)
                and isinstance(field_node.target, ast.Name)
                and isinstance(doc, ast.Expr)
                and isinstance(doc.value, ast.Constant)
                and isinstance(doc.value.value, str)
            ):
                docs[field_node.target.id] = " ".join(doc.value.value.split())
    return docs


@dataclass
class TaskConfig:
    """Which problems to train and evaluate on (`tasks.make_task` builds them)."""

    kind: str = ruled("arithmetic", one_of(options.TASK_KINDS))
    """`arithmetic` (two-operand addition, the tiny model's course task), `word_problems` (generated GSM8K-style
    multi-step problems, offline: the real-Gemma CPU preset's task), `gsm8k` (GSM8K itself from `source`), or your
    own data: `file` (a .jsonl/.json/.csv/.parquet file at `source`) or `hub` (a Hugging Face dataset id in `source`),
    read with the `*_column` settings below (`data_task.load_task`)."""
    operations: tuple[int, ...] = ruled((2, 3, 4), STEP_COUNTS)
    """word_problems: how many arithmetic steps a problem takes (its templates' lengths, from 2 to 4) — the
    difficulty knob."""
    demonstration_operations: tuple[int, ...] | None = ruled(None, STEP_COUNTS)
    """word_problems: the step counts of the worked solutions SFT sees (None = `operations`): e.g. (2,) with
    operations (3,) demonstrates 2-step problems only and tests on 3-step ones, beyond the demonstrations."""
    source: str = "openai/gsm8k"
    """gsm8k: the hub dataset (needs network; test split held out) or a local GSM8K-format .jsonl/.json file
    (`question`, `answer` ending in `#### N`; its first num_test rows held out). file: the data file's path. hub: the
    dataset id."""
    prompt_column: str = "prompt"
    """file/hub: the column holding each question (text, or chat messages)."""
    answer_column: str = "answer"
    """file/hub: the column holding the right final answer."""
    solution_column: str | None = None
    """file/hub: the column holding a worked solution, for SFT (None: no SFT rows; rows without one are skipped)."""
    system_column: str | None = None
    """file/hub: a column holding a per-row instruction (None: `system_prompt` for every row)."""
    answer_type: str = ruled("auto", one_of(options.ANSWER_TYPES))
    """file/hub: how answers are compared (`answer_format.ANSWER_TYPES`: number, choice, string, regex; auto = inferred
    per
    row from the answer). A file's own `answer_type` column wins, row by row."""
    split: str = "train"
    """hub: the dataset split to read (the kit holds out its own `num_test` rows from it)."""
    seed: int = ruled(1234, within(0, 2**32 - 1))
    """Seed for problems; demonstrations, the prompt stream and the held-out set are disjoint."""
    num_demonstrations: int = ruled(200, at_least(1))
    """Size of the fixed SFT demonstration pool. Small on purpose: RL pays where demonstrations are scarce. (file/hub:
    every training row with a solution.)"""
    num_test: int = ruled(200, at_least(1))
    """Held-out problems for greedy evaluation (file/hub: drawn by `seed`, the same rows on every run)."""
    min_value: int = ruled(10, at_least(0))
    """arithmetic: smallest operand."""
    max_value: int = ruled(99, at_least(1))
    """arithmetic: largest operand (two-digit addition by default)."""
    system_prompt: str | None = None
    """Optional instruction folded into the first user turn (Gemma has no system role). The tiny model
    learns the format from SFT; real Gemma benefits from an instruction."""

    def __post_init__(self) -> None:
        validate(self)
        if self.max_value < self.min_value:
            raise ConfigError(f"TaskConfig.max_value={self.max_value}: must be ≥ min_value ({self.min_value})")


@dataclass
class FineTuneSettings:
    """What SFT and RFT share: each step is a cross-entropy step on chosen completions (demonstrations, or the
    model's own right answers), with AdamW under warm-up and cosine decay, fixed length buckets, and the same
    logging, saving and stopping."""

    steps: int = ruled(200, at_least(0))
    """Optimizer steps. For SFT, 200 × batch 32 = 32 passes over 200 demonstrations: enough to learn the format and
    part of the arithmetic, leaving GRPO room to improve (docs/tuning.md)."""
    learning_rate: float = ruled(1e-3, above(0))
    """Peak AdamW learning rate. High because the tiny model is small (higher generalises worse); use ~2e-4
    with LoRA on real Gemma."""
    weight_decay: float = ruled(0.0, at_least(0))
    """AdamW weight decay; 0 keeps the warm-up simple."""
    warmup_steps: int = ruled(20, at_least(0))
    """Linear warm-up steps before cosine decay."""
    max_grad_norm: float = ruled(1.0, above(0))
    """Gradient clipping norm."""
    max_length: int = ruled(128, at_least(8))
    """Sequences are padded to a multiple of `pad_to_multiple_of` up to this length; longer ones are an error."""
    pad_to_multiple_of: int = ruled(32, at_least(1))
    """Length bucket size for static shapes: a few buckets, each compiled once on XLA."""
    log_every: int = ruled(10, at_least(1))
    """Write a metrics row every N steps."""
    seed: int = ruled(0, within(0, 2**32 - 1))
    """Seed for batch order."""
    max_skipped_steps: int = ruled(5, at_least(0))
    """Stop with an error after this many consecutive steps skipped for a non-finite loss or gradient (one bad
    step is skipped and training goes on). 0 = never stop."""
    save_every: int = ruled(0, at_least(0))
    """Save `output_dir/checkpoint` every N steps (0 = by time only, see save_every_seconds)."""
    save_every_seconds: float | None = ruled(300.0, above(0))
    """Also save once this many seconds have passed since the last save, so a runtime that dies loses at most about
    this much training (None = by steps only). `grpo-kit sft` resumes from that checkpoint when run again."""
    output_dir: str | None = "runs/sft"
    """Where metrics and the checkpoint go."""
    report_to: tuple[str, ...] = ruled((), subset_of(options.TRACKERS))
    """Experiment trackers that also get every metrics row's numbers (`trackers.py`; TRL's `report_to`): any of
    trackio, wandb, tensorboard; none by default. A single name is taken as a list of one."""
    max_seconds: float | None = ruled(None, above(0))
    """Optional wall-clock budget; stops early when exceeded (None = run all steps)."""
    padding_free: bool | None = None
    """None or True: for Gemma on cpu/cuda each step's forward runs on the real tokens only (GRPO's packed forward,
    `sft.sft_loss`) instead of the padded batch through HF's forward; the same loss up to float order, in less time
    (docs/cpu_choices.md). False, or on XLA (fixed shapes), or under gradient checkpointing: the padded forward."""
    cpu_bf16: bool | None = None
    """None or True: with `padding_free`, on a CPU with native bf16 products (`products.cpu_bf16_products`) and an
    fp32 LoRA model, the frozen base weights are multiplied in bf16, as in `GRPOConfig.cpu_bf16`'s update, so that SFT,
    its continuation (the arc's control) and RFT get the speed GRPO's update gets (docs/cpu_choices.md); LoRA, the head,
    the loss and all gradients stay fp32. False, other CPUs, or GRPO_KIT_CPU_BF16=0: the model's own dtype."""

    def __post_init__(self) -> None:
        _one_tracker_as_a_list(self)
        validate(self)


@dataclass
class SFTConfig(FineTuneSettings):
    """Supervised warm-up on demonstrations: teaches the `<reasoning>…</reasoning><answer>…</answer>` format."""

    batch_size: int = ruled(32, at_least(1))
    """Sequences per step; fixed so every step has the same shape (one compiled graph on XLA)."""


@dataclass
class RolloutSettings:
    """How new completions are sampled, in the names and meanings GRPOConfig gives them: what RFT takes from GRPO
    (`rft.rft_config`), so that the control samples what GRPO samples."""

    prompts_per_step: int = ruled(8, at_least(1))
    """New prompts per step."""
    group_size: int = ruled(4, at_least(1))
    """Completions sampled per prompt."""
    temperature: float = ruled(0.8, above(0))
    """Sampling temperature of the completions."""
    max_new_tokens: int = ruled(80, at_least(1))
    """Completion length; for RFT a completion that has not finished by then is not kept."""
    prompt_bucket: int = ruled(32, at_least(1))
    """Prompt length bucket, as GRPOConfig.prompt_bucket."""


@dataclass
class RFTConfig(FineTuneSettings, RolloutSettings):
    """Rejection-sampling fine-tuning (RFT, RAFT): each step samples `group_size` completions for each of
    `prompts_per_step` new prompts from the current model, keeps the right ones (finished, correct answer, each text
    once per prompt) and takes one fine-tuning step on whatever was accepted. Learning from the verifier without
    GRPO's advantages: the control that asks whether a GRPO gain is GRPO's (arXiv 2504.11343)."""

    output_dir: str | None = "runs/rft"
    """Where metrics (rft_metrics.jsonl) and the checkpoint go."""


@dataclass
class GRPORollout:
    """GRPOConfig's rollout: what each step samples."""

    prompts_per_step: int = ruled(128, at_least(1))
    """Distinct prompts per step. With group_size 4 this is 512 completions, all one shape. Many distinct
    prompts average out the noisy policy gradient; at equal cost more distinct problems beat more samples of
    each (docs/tuning.md)."""
    group_size: int = ruled(4, at_least(2))
    """Completions per prompt (G). Advantages compare completions within a group; TRL's default is 8. With
    the dense answer-digits reward 4 samples already differ in most groups."""
    max_new_tokens: int = ruled(32, at_least(1))
    """Completion buffer length. Fixed, so sampling compiles the same graphs every step."""
    max_prompt_tokens: int | None = ruled(1024, at_least(1))
    """Longest prompt allowed, in tokens after the chat template; checked over the whole dataset before the first
    step (and on every batch), so an over-long row is named at once instead of slowing every step (on XLA each
    longer prompt width is a new compiled program). None = no limit."""
    prompt_bucket: int = ruled(16, at_least(1))
    """Prompts are left-padded to a multiple of this (a few buckets, each compiled once on XLA). Smaller wastes
    less compute on padding; larger means fewer distinct shapes."""
    temperature: float = ruled(0.7, above(0))
    """Sampling temperature; the training forward divides logits by the same value, so importance ratios
    stay honest. Below 1 because a small model after SFT samples mostly wrong answers at 1.0 (groups with no
    right answer give no signal), while too low a temperature explores too little (docs/tuning.md)."""
    top_k: int = ruled(0, at_least(0))
    """Keep only the k most likely tokens (0 = off)."""
    top_p: float = ruled(1.0, within(0, 1, low_open=True))
    """Nucleus sampling mass (1.0 = off)."""
    dynamic_sampling_rollouts: int = ruled(1, at_least(1))
    """DAPO's dynamic sampling (arXiv 2503.14476), capped: a group whose G rewards are all equal has A = 0 and teaches
    nothing, so while fewer than `prompts_per_step` groups of the step differ, it samples `prompts_per_step` more
    prompts — up to this many rollouts in all — and the update trains on the first `prompts_per_step` groups that
    differ (the first group if none does). 1 = off: one rollout, every group trained. Metrics (rewards, accuracy,
    `zero_std_fraction`) cover every group sampled; `rollouts` and `trained_groups` say what the step did (the
    latter after `skip_zero_advantage_groups` too). cpu/cuda (XLA keeps one batch shape)."""
    difficulty_targeting: bool = False
    """Online difficulty targeting (`difficulty.DifficultyTargeting`, arXiv 2504.03380): track each level's pass rate
    (the `accuracy_reward` outcomes of the rollouts already made, per value of the prompt rows' `difficulty_key`) and
    keep a prompt drawn from the stream with probability ∝ p(1 − p), so steps spend their rollouts where groups are
    likeliest to differ. Needs `accuracy_reward` among the rewards and that column in every prompt row (the generated
    word problems name their template). Off by default: prompts come in the stream's order."""
    difficulty_key: str = "level"
    """difficulty_targeting: the prompt column that names a prompt's level."""


@dataclass
class GRPORewards:
    """GRPOConfig's rewards and advantages: how the samples are compared."""

    reward_weights: dict[str, float] | None = None
    """Weight per reward function name; missing names get 1.0."""
    accuracy_reward: str | None = "correctness_reward"
    """The reward whose score 1.0 marks a correct answer: the share of such completions is the step's `accuracy`
    metric (None, or a name not among the rewards: no accuracy metric). Default: the kit's `correctness_reward`."""
    gate_shaped_rewards: bool = False
    """Count the shaped rewards (every reward but `accuracy_reward`, e.g. `answer_digits_reward`, format rewards) only
    in groups whose outcome varies (`advantages.outcome_gated_rewards`): a group with all-wrong or all-right answers
    gets no advantage from them, instead of z-scored noise (verl-recipe PR #125). Logged rewards stay the plain
    weighted sums. Needs `accuracy_reward` among the rewards. Off by default: with it, hard prompts teach nothing
    until one answer in a group is right."""
    reward_timeout_seconds: float | None = ruled(600.0, above(0))
    """A reward function still running after this many seconds on one batch stops the run with an error naming it
    (a hung reward would otherwise block training for good, and the stop button acts only between steps).
    None = wait forever."""
    reward_on_error: str = ruled("raise", one_of(options.REWARD_ON_ERROR))
    """`raise` stops the run naming the reward and completion; `zero` scores 0 and counts the failure."""
    advantage: str = ruled("zscore", one_of(tuple(ESTIMATORS)))
    """`zscore` (group mean/std, GRPO), `centered` (mean only, Dr GRPO), `mad` (median/MAD, robust),
    `batch` (group mean, batch std, as in REINFORCE++-style batch normalisation)."""
    advantage_tau: float = ruled(1.0, above(0))
    """Divide advantages by τ after normalisation (τ > 1 softens updates)."""
    advantage_clip: str = ruled("none", one_of(CLIP_MODES))
    """`none`, `symmetric` (clip to ±clip_value), `asymmetric` (clip to [-clip_low, clip_value]), `tanh` (soft)."""
    advantage_clip_value: float = ruled(5.0, above(0))
    """Upper bound for advantage clipping."""
    advantage_clip_low: float = ruled(5.0, above(0))
    """Lower magnitude for asymmetric clipping."""
    winsorize_quantile: float = ruled(0.0, within(0, 0.5, high_open=True))
    """Winsorise rewards per batch at this quantile (0 = off): tames outlier rewards before normalisation."""


@dataclass
class GRPOUpdate:
    """GRPOConfig's algorithm: the update."""

    learning_rate: float = ruled(1e-4, above(0))
    """AdamW learning rate (constant after warm-up; the dashboard may change it live). Small because the
    policy after SFT sits in a sharp spot that larger steps leave (KL up, accuracy down). Use ~1e-5 for LoRA
    on real Gemma."""
    warmup_steps: int = ruled(3, at_least(0))
    """Linear learning-rate warm-up. Adam's first steps move every weight by about ±lr whatever the gradient's
    size; with noisy policy gradients that is a random kick, so ramp up instead."""
    weight_decay: float = ruled(0.0, at_least(0))
    """AdamW weight decay."""
    max_grad_norm: float = ruled(1.0, above(0))
    """Gradient clipping norm; clipping keeps a bad batch from wrecking the policy."""
    beta: float = ruled(0.0, at_least(0))
    """KL coefficient toward the reference policy. 0 (TRL's default) skips the reference forward entirely;
    then KL is still measured when `log_kl` is on, but does not enter the loss."""
    log_kl: bool = True
    """Measure KL to the reference even when beta = 0 (one extra no-grad forward). Turn off for speed."""
    kl_estimator: str = ruled("k3", one_of(tuple(KL_ESTIMATORS)))
    """`k1` (log-ratio, unbiased, can be negative) or `k3` (Schulman's low-variance, non-negative)."""
    target_kl: float | None = ruled(None, above(0))
    """Adaptive β: when set, β moves toward keeping KL near this value each step (None = fixed β)."""
    epsilon: float = ruled(0.2, within(0, 1, low_open=True, high_open=True))
    """Lower clip range of the PPO ratio: ratio ≥ 1 − ε."""
    epsilon_high: float | None = ruled(None, above(0))
    """Upper clip range: ratio ≤ 1 + ε_high. None = ε. DAPO's clip-higher uses 0.28."""
    loss_type: str = ruled("grpo", one_of(tuple(LOSSES)))
    """Aggregation / objective: `grpo` (mean per sequence, then over sequences), `bnpo` / `dapo` (mean over
    all tokens), `dr_grpo` (sum over tokens / (batch × max_new_tokens)), `cispo` (clipped IS weight × log-prob)."""
    importance_sampling_level: str = ruled("token", one_of(IMPORTANCE_SAMPLING_LEVELS))
    """`token` (PPO/GRPO) or `sequence` (GSPO: one length-normalised ratio per sequence)."""
    num_iterations: int = ruled(1, at_least(1))
    """μ: optimizer passes over each rollout batch. >1 reuses the rollout's old log-probs (PPO-style)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = off); positive values keep exploration up."""
    mask_truncated_completions: bool = False
    """Exclude completions that hit max_new_tokens without stopping from the loss (DAPO)."""
    ema_reference: float = ruled(0.0, within(0, 1))
    """If > 0, after each step the reference moves toward the policy: ref ← (1 − α) ref + α policy
    (full fine-tuning only). 0 keeps the reference frozen."""
    micro_batch_size: int = ruled(128, at_least(1))
    """Completions per forward/backward; gradients accumulate over micro-batches. Fixed shape on XLA."""


@dataclass
class GRPOSpeed:
    """GRPOConfig's speed switches: the same result in less time (each documents how far "the same" goes)."""

    compile_sampler: bool | None = None
    """`torch.compile` the lean Gemma decode step used in rollouts. None (default) = on GPUs Triton supports
    (compute capability ≥ 7.0 with triton installed), off elsewhere: a GPU earns the first rollout's compile time back,
    2 CPU cores do not (docs/cpu_choices.md; and inductor needs a C++ compiler there). XLA compiles its graphs anyway.
    Each new batch or prompt-bucket shape compiles again, and finished rows stay in the batch."""
    share_prompt_forward: bool = True
    """Run each prompt through the model once for its whole group in the log-prob and training forwards, and
    repeat its keys/values for the G completions, instead of running it G times. Same log-probs and gradients
    (up to float order); the update does (B/G)·P + B·N positions instead of B·(P + N). Used when micro_batch_size is a
    multiple of group_size (micro-batches then hold whole groups)."""
    padding_free: bool = True
    """Gemma on cpu/cuda: the log-prob and training forwards compute real tokens only — no prompt left
    padding, nothing after a completion's stop token, the LM head on completion tokens only — packed into one
    matrix and unpacked for attention (`decoder.packed_completion_hidden`). Same log-probs and gradients (up
    to float order). XLA keeps the padded fixed shapes (packed sizes change every step: a new graph each
    time); under gradient checkpointing the padded forward runs too."""
    reuse_sampler_head: bool = True
    """On the CPU, with a frozen LM head of ≥ 32k entries (LoRA), no final softcap, no dropout and entropy_coef 0:
    the sampler also keeps, for each token it draws, the policy's expected head row E = Σ_v π_v W_v (one more
    product with the head per token, streamed with the draw), and the update's first pass takes log π's gradient
    from it, ∂log π(y)/∂h = (W_y − E)/T, instead of running the head again (two products per token). The weights
    are those the tokens were sampled with, so the gradients are the same up to float order; False recomputes.
    With `cpu_bf16` the sampler's head products are bf16; its log-probs then differ from fp32 by bf16 rounding of the
    logits (< 0.1 nats), and log π's value in the update is the sampler's."""
    cpu_bf16: bool = True
    """On a CPU where bf16 products are the faster (AMX, or AVX512-BF16 on an AMD CPU; `products.cpu_bf16_products`) and
    an fp32 model: the rollout multiplies the layers' projections and the LM head in bf16 (`products.product_dtype`),
    and the update's
    padding-free Gemma forward multiplies the frozen base weights in bf16 (LoRA; `decoder.frozen_linears`), their
    backward following (docs/cpu_choices.md).
    LoRA, norms, residual sums, attention, softmax, log-probs, the loss, the trained weights, their gradients and the
    optimizer stay fp32. Not applied where the
    update compares the sampler's log-probs with its own (a reference pass, or μ > 1 with `reuse_sampler_head`):
    a ratio or KL of one policy must be exactly 1 or 0, not bf16 rounding noise. False, other CPUs, GPUs, TPUs and
    GRPO_KIT_CPU_BF16=0 (for the whole process): the model's own dtype throughout."""
    skip_zero_advantage_groups: bool = True
    """On cpu/cuda, with beta 0 (and no KL to measure: `log_kl` off or no reference), entropy_coef 0 and any
    loss_type but `bnpo`: the update's forward and backward run only on groups whose advantages are not all 0.
    A group whose G rewards are equal has A = 0 for every completion, so its loss terms and their gradients are
    exactly 0, and the full-batch normalisers (sequences, tokens) are kept: the weights after the step are the
    same up to float order, for less work (the share left out is the step's `zero_std_fraction`). At least one
    group always runs. The step's entropy, ratio and clip statistics are then means over the groups trained on
    (`trained_fraction` says how many). `bnpo` is left alone: its micro-batch token mean counts every row. XLA
    keeps the full batch (one fixed shape). False trains on every group."""


@dataclass
class GRPORun:
    """GRPOConfig's run: its length, seed, where it writes, when it saves."""

    steps: int = ruled(60, at_least(0))
    """Optimizer steps (one rollout batch each when num_iterations = 1). 60 for the CPU demo: enough for held-out
    accuracy to level off on the tiny Gemma while the demo stays a few minutes long on 2 cores."""
    seed: int = ruled(0, within(0, 2**32 - 1))
    """Seed for prompt order and sampling noise."""
    output_dir: str | None = "runs/grpo"
    """Where metrics.jsonl and checkpoints go."""
    report_to: tuple[str, ...] = ruled((), subset_of(options.TRACKERS))
    """Experiment trackers that also get every metrics row's numbers (`trackers.py`; TRL's `report_to`): any of
    trackio, wandb, tensorboard; none by default. A single name is taken as a list of one."""
    max_seconds: float | None = ruled(None, above(0))
    """Optional wall-clock budget; stops early when exceeded (None = run all steps)."""
    save_every: int = ruled(0, at_least(0))
    """Save `output_dir/checkpoint` every N steps (0 = by time only, see save_every_seconds)."""
    save_every_seconds: float | None = ruled(300.0, above(0))
    """Also save once this many seconds have passed since the last save, so a runtime that dies loses at most about
    this much training (None = by steps only). `grpo-kit train` resumes from that checkpoint when run again."""
    max_skipped_steps: int = ruled(5, at_least(0))
    """Stop with an error after this many consecutive steps skipped for a non-finite loss or gradient (a diverging
    run; one bad step is skipped and training goes on). 0 = never stop."""
    log_completions: int = ruled(4, at_least(0))
    """How many completions (with rewards and advantages) to keep in each metrics row for the browser."""
    compile_warmup_steps: int = ruled(2, at_least(0))
    """On XLA: steps after which any new graph compilation is warned about (step 1 compiles the rollout and
    the training graphs, step 2 the optimizer update once Adam's state exists)."""


@dataclass
class GRPOConfig(GRPORun, GRPOSpeed, GRPOUpdate, GRPORewards, GRPORollout):
    """Group Relative Policy Optimization. Names follow TRL's GRPOConfig where the idea is the same. One flat set of
    settings (`grpo:` in a YAML config, `cfg.grpo.<name>` in code), written in five parts by concern, in this order:
    `GRPORollout` (what each step samples), `GRPORewards` (rewards and advantages), `GRPOUpdate` (the algorithm),
    `GRPOSpeed` (switches that change how fast a step runs, not what it learns, up to float order) and `GRPORun`
    (length, seed, output, saving)."""

    def __post_init__(self) -> None:
        _one_tracker_as_a_list(self)
        validate(self)
        n = self.prompts_per_step * self.group_size
        if n % self.micro_batch_size:
            raise ConfigError(f"GRPOConfig.micro_batch_size={self.micro_batch_size}: must divide prompts_per_step × "
                              f"group_size = {n}")

    def check_run(self, reward_names: list[str], *, lora: bool, fixed_shapes: bool) -> None:
        """The checks these settings need the run for: the rewards' names (`reward_weights`, `accuracy_reward`),
        whether the model trains a LoRA adapter, whether the device runs fixed shapes (XLA). Raises a one-line
        ConfigError naming the setting."""
        unknown = set(self.reward_weights or {}) - set(reward_names)
        if unknown:
            raise ConfigError(
                f"GRPOConfig.reward_weights names unknown rewards {sorted(unknown)}; rewards are {reward_names}")
        if self.ema_reference > 0 and lora:
            raise ConfigError(
                "GRPOConfig.ema_reference needs full fine-tuning; under LoRA the reference is the base model")
        if self.dynamic_sampling_rollouts > 1 and fixed_shapes:
            raise ConfigError(f"GRPOConfig.dynamic_sampling_rollouts={self.dynamic_sampling_rollouts}: must be 1 on "
                              "XLA (one batch shape per step)")
        for setting in ("gate_shaped_rewards", "difficulty_targeting"):
            if getattr(self, setting) and self.accuracy_reward not in reward_names:
                raise ConfigError(f"GRPOConfig.{setting} needs accuracy_reward ({self.accuracy_reward!r}) among the "
                                  f"rewards, which are {reward_names}")

    def loss_spec(self, *, epsilon: float, beta: float | Any) -> LossSpec:
        """The policy loss's settings for a step: these settings, with ε and β as the step applies them (live
        controls, or the adaptive β)."""
        return LossSpec(loss_type=self.loss_type, epsilon=epsilon, epsilon_high=self.epsilon_high,
                        importance_sampling_level=self.importance_sampling_level, beta=beta,
                        kl_estimator=self.kl_estimator, entropy_coef=self.entropy_coef,
                        max_completion_length=self.max_new_tokens)


TRL_GRPO_NAMES: dict[str, str] = {
    "group_size": "num_generations", "max_new_tokens": "max_completion_length", "temperature": "temperature",
    "top_k": "top_k", "top_p": "top_p", "learning_rate": "learning_rate", "warmup_steps": "warmup_steps",
    "weight_decay": "weight_decay", "max_grad_norm": "max_grad_norm", "beta": "beta", "epsilon": "epsilon",
    "epsilon_high": "epsilon_high", "loss_type": "loss_type", "importance_sampling_level": "importance_sampling_level",
    "num_iterations": "num_iterations", "mask_truncated_completions": "mask_truncated_completions",
    "steps": "max_steps", "seed": "seed",
}
"""Each `GRPOConfig` field with the same meaning in `trl.GRPOConfig` (TRL 1.16), by TRL's name. Besides these,
`trl_grpo_settings` derives TRL's batch size, reward scaling and reward weights."""

TRL_SCALE_REWARDS = {"zscore": "group", "batch": "batch", "centered": "none"}
"""`GRPOConfig.advantage` → TRL's `scale_rewards` (reward − the group's mean, divided by the group's std, by the
batch's std, or by nothing); `mad` has no TRL counterpart."""


def trl_grpo_settings(config: GRPOConfig, reward_names: list[str]) -> dict[str, Any]:
    """`config` as keyword arguments of `trl.GRPOConfig`: the fields in `TRL_GRPO_NAMES` under TRL's names; one
    optimizer step over `prompts_per_step × group_size` completions (`per_device_train_batch_size`, on one device
    with no gradient accumulation); `scale_rewards` from `advantage`; `reward_weights` as a list in the order of
    `reward_names` (the reward functions given to TRL's trainer; 1.0 where `config.reward_weights` names none).
    ValueError for an advantage estimator TRL lacks."""
    if config.advantage not in TRL_SCALE_REWARDS:
        raise ValueError(
            f"advantage={config.advantage!r} has no TRL counterpart: one of {', '.join(TRL_SCALE_REWARDS)}")
    settings = {trl: getattr(config, ours) for ours, trl in TRL_GRPO_NAMES.items()}
    weights = config.reward_weights or {}
    return {**settings, "per_device_train_batch_size": config.prompts_per_step * config.group_size,
            "scale_rewards": TRL_SCALE_REWARDS[config.advantage],
            "reward_weights": [float(weights.get(name, 1.0)) for name in reward_names]}


@dataclass
class RunConfig:
    """Every setting of a run, as a preset or a YAML file gives them: the model, the task, SFT, GRPO, where outputs
    go, and for the arc (`make demo`, notebook 08: SFT warm-up, then GRPO with verifier rewards, the controls and
    an evaluation after each stage) its time budget and controls. Each command takes the sections it needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    output_dir: str = "runs/demo"
    """Where summary.json, progress.json, the plots and each phase's directory (sft/, grpo/, control/: metrics and
    checkpoints) go. Running again with the same settings continues where the last run stopped."""
    report_to: tuple[str, ...] | None = ruled(None, subset_of(options.TRACKERS))
    """Trackers for every phase of the arc (SFT, GRPO, the controls), each phase a run of its own there; None = each
    phase's own `sft.report_to` / `grpo.report_to`."""
    time_budget_minutes: float | None = ruled(None, above(0))
    """Size the SFT and GRPO phases so that the whole run — model load, every evaluation and the control
    included — takes about this long, from step and evaluation times measured as it goes (so it fits a Colab or
    Kaggle session). None = run sft.steps and grpo.steps as set."""
    sft_fraction: float | None = ruled(0.3, within(0, 1, low_open=True, high_open=True))
    """With a time budget: the share of the training time (the budget less load and evaluations) that SFT gets;
    GRPO gets the rest (split evenly with the control when there is one). None = SFT runs `sft.steps` as set, and
    the budget sizes GRPO and the controls from what is left after it (on a slower machine they get fewer steps)."""
    control: bool = False
    """After GRPO, also continue SFT from the SFT model for as long as GRPO trained, and evaluate it the same way:
    does GRPO beat simply more SFT in the same time? Off by default (it doubles the training time)."""
    rft_control: bool = False
    """After GRPO (and the SFT control), also run rejection-sampling fine-tuning from the SFT model for as long as
    GRPO trained (`rft.RFTTrainer`: SFT steps on the model's own right answers to GRPO's prompts, sampled as GRPO
    samples them) and evaluate it: is a GRPO gain GRPO's, or only learning from the verifier? Off by default."""
    control_steps: int | None = ruled(None, at_least(1))
    """Steps of the SFT control; None = as many as fit the seconds GRPO trained, timed after its first steps and
    again a third of the way in (`course.arc.Arc.control`). A fixed count makes "the same time" independent of whatever
    else the machine is doing (the study sets it from a clean run)."""
    rft_steps: int | None = ruled(None, at_least(1))
    """Steps of the RFT control; None = as many as fit the seconds GRPO trained, timed after its first steps."""
    rft_learning_rate: float | None = ruled(None, above(0))
    """The RFT control's learning rate; None = GRPO's (`grpo.learning_rate`). RFT learns from the model's own samples
    as GRPO does, and RAFT++ (arXiv 2504.11343) trains it in the RL trainer, with its settings. SFT's rate, ten times
    GRPO's in the presets, throws the model off its SFT start (docs/cpu_choices.md). The study's cells train RFT at
    SFT's rate, as its recorded cells did."""
    eval_batch_size: int = ruled(64, at_least(1))
    """Held-out problems decoded together in an evaluation (their k samples with eval_pass_k). A CPU decodes a larger
    batch faster per problem (the weights are read once per token for every row); an accelerator's memory bounds it."""
    eval_pass_k: int = ruled(0, at_least(0))
    """Also sample k completions per held-out problem at GRPO's temperature after SFT, GRPO and the controls, and
    report sampled pass@1 (their mean accuracy), maj@k (majority vote) and pass@k (any right); 0 = greedy accuracy
    only (this costs k evaluations)."""

    def __post_init__(self) -> None:
        _one_tracker_as_a_list(self)
        validate(self)


def _one_tracker_as_a_list(cfg: Any) -> None:
    """report_to="tensorboard", as TRL takes it, read as ("tensorboard",)."""
    if isinstance(cfg.report_to, str):
        cfg.report_to = (cfg.report_to,)



PRESETS_FILE = Path(__file__).resolve().parents[1] / "assets" / "presets.yaml"
"""The presets as data: `presets` (each one's settings, section by section, over the config classes' defaults) and
`times` (what each real-Gemma preset is expected to take, and its basis); docs/presets.md gives their sources."""

_PRESET_DATA: dict[str, Any] = yaml.safe_load(PRESETS_FILE.read_text())

PRESETS: dict[str, dict[str, Any]] = _PRESET_DATA["presets"]
"""Named presets: overrides per config section, picked by name (CLI `--preset`), from `PRESETS_FILE`."""

GRPO_RECIPE: dict[str, Any] = _PRESET_DATA["shared"]["grpo_recipe"]
"""The GRPO recipe every real-Gemma preset runs (the study's, docs/capstone.md): shaped rewards count only where the
outcome varies (verl-recipe PR #125), prompts drawn by their level's pass rate p in proportion to p(1 − p) (arXiv
2504.03380; the word problems' level is their template, GSM8K's its solution's step count) and groups whose advantages
are all zero left out of the update (the same gradient, less work; cpu/cuda with β 0)."""

TPU_BOARDS: dict[str, tuple[int, float]] = {
    "v2-8": (8, 8.0), "v3-8": (8, 16.0), "v5e-1": (1, 16.0), "v5e-8": (8, 16.0), "v6e-1": (1, 32.0),
    "v6e-8": (8, 32.0)}
"""The TPU boards with a preset: devices (chips, or cores on v2/v3) and GiB of HBM per device, as Google publishes
them (v5e: 16 GB, v6e Trillium: 32 GB a chip). `planner.ACCELERATORS` plans on these numbers."""

PRESET_TIMES: dict[str, dict[str, Any]] = _PRESET_DATA["times"]
"""Expected wall time per GRPO step, per SFT step, per greedy evaluation of 200 held-out problems and per run of each
real-Gemma preset (a run is its time budget), and where the numbers come from: measured on the named machine, or an
estimate from the hardware's published speed where we have no such machine (`PRESETS_FILE`). `notebook.capstone_config`
prints the line for the preset it picks; `course.CourseMode.minutes` estimates the course's notebooks from them."""


def tpu_board_micro_batch(board: str, *, family: str = "gemma-3-1b") -> int:
    """The micro-batch of `board`'s preset for `family` (Gemma 3 1B by default), as `grpo-kit plan` picks it."""
    return PRESETS[f"tpu-{board}-{family}"]["grpo"]["micro_batch_size"]


C = TypeVar("C")


def apply_overrides(cfg: C, overrides: dict[str, Any], where: str = "config") -> C:
    """Return a copy of dataclass `cfg` with `overrides` applied (nested dicts reach nested dataclasses).

    Unknown keys raise a ValueError naming the key, so a typo in YAML never silently does nothing.
    """
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    changes: dict[str, Any] = {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"{where}: expected a mapping of settings, got {overrides!r}")
    for key, value in overrides.items():
        if key not in fields:
            raise ConfigError(f"{where}: unknown setting {key!r}; known: {', '.join(sorted(fields))}")
        current = getattr(cfg, key)
        if dataclasses.is_dataclass(current):
            changes[key] = apply_overrides(current, value, f"{where}.{key}")
        elif isinstance(current, tuple) and isinstance(value, list):
            changes[key] = tuple(value)
        else:
            changes[key] = value
    return dataclasses.replace(cfg, **changes)


MODEL_PRESETS = {"gemma-4-e2b": "gemma-4-e2b"}
"""The models with presets of their own beside Gemma 3 1B's (the default): a name containing the key (any case,
`google/` and `-it` or not) picks the board's `<board>-<value>` preset."""


def preset_family(model: str | None) -> str:
    """The preset family `auto` picks for a model name: Gemma 4 E2B's for its names (`MODEL_PRESETS`), Gemma 3 1B's for
    no name or any other (whose name then replaces the preset's, as --model does)."""
    lowered = (model or "").lower()
    return next((family for key, family in MODEL_PRESETS.items() if key in lowered), "gemma-3-1b")


def auto_preset(hardware: str | None = None, *, model: str | None = None) -> str:
    """The preset for the detected hardware (`device.detect_accelerator`): a TPU board's Gemma 3 1B preset, the GPU
    preset, or the CPU tiny-Gemma demo. `model` naming Gemma 4 E2B picks that board's (or the GPU's) E2B preset
    instead (`preset_family`); the CPU keeps its demo. A TPU board without a preset of its own runs
    `board_for_memory`'s choice for the devices and memory its runtime reports, said in one line; SetupError where it
    reports none or none fits."""
    if hardware is None:
        from ..engine.device import detect_accelerator

        hardware = detect_accelerator()
    family = preset_family(model)
    if f"tpu-{hardware}-{family}" in PRESETS:
        return f"tpu-{hardware}-{family}"
    if hardware.startswith("v"):
        from ..engine.device import SetupError, xla_device_memory

        reported = xla_device_memory()
        if reported is None:
            raise SetupError(f"TPU {hardware} has no preset here and its runtime reports no device memory to plan "
                             f"from: pass --preset with a board like it ({', '.join(TPU_BOARDS)})")
        devices, gib = reported
        board = board_for_memory(devices, gib, family=family)
        kind = "preset" if family == "gemma-3-1b" else f"{family} preset"
        if board is None:
            raise SetupError(f"TPU {hardware} has no {kind} here, and no board's {kind} fits {devices} devices of "
                             f"{gib:.0f} GiB: size one with `grpo-kit plan` and pass it with --config")
        print(f"grpo-kit: TPU {hardware} has no {kind} of its own; its runtime reports {devices} devices of "
              f"{gib:.0f} GiB, so it runs tpu-{board}-{family} (planned for {TPU_BOARDS[board][0]} of "
              f"{TPU_BOARDS[board][1]:.0f} GiB; each of yours holds as much or more)", file=sys.stderr)
        return f"tpu-{board}-{family}"
    return f"gpu-{family}" if hardware == "cuda" else "cpu-tiny"


def board_for_memory(devices: int, gib_per_device: float, *, family: str = "gemma-3-1b") -> str | None:
    """The board whose `family` preset fits `devices` devices of `gib_per_device` GiB each, by the planner's own fits:
    a board with as many devices and no more memory each (the largest such), else a one-device board with no more
    memory whose micro-batch splits over `devices` (each device then holds a share of that board's rows); None if
    none."""
    boards = {b: v for b, v in TPU_BOARDS.items() if f"tpu-{b}-{family}" in PRESETS}
    micro = {board: tpu_board_micro_batch(board, family=family) for board in boards}
    same = [b for b, (n, g) in boards.items() if n == devices and g <= gib_per_device]
    single = [b for b, (n, g) in boards.items() if n == 1 and g <= gib_per_device and micro[b] % devices == 0]
    for found in (same, single):
        if found:
            return max(found, key=lambda b: (TPU_BOARDS[b][1], list(TPU_BOARDS).index(b)))  # ties: the newer
    return None


def load_run_config(preset: str = "cpu-tiny", yaml_path: str | Path | None = None, *,
                    model: str | None = None) -> RunConfig:
    """Build a RunConfig from a named preset (`auto`: picked for the detected hardware and, given one, the `model`
    name the run will train: `auto_preset`), then a YAML file of overrides (same keys as the dataclasses)."""
    if preset == "auto":
        preset = auto_preset(model=model)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {sorted(PRESETS)}")
    cfg = apply_overrides(RunConfig(), PRESETS[preset], f"preset {preset}")
    if yaml_path is not None:
        try:
            data = yaml.safe_load(Path(yaml_path).read_text()) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            raise ConfigError(f"{yaml_path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{yaml_path}: expected a mapping of settings at the top level, got {data!r}")
        cfg = apply_overrides(cfg, data, str(yaml_path))
    return cfg


