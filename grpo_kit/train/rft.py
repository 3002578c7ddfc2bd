"""Rejection-sampling fine-tuning (RFT): learn from the verifier without GRPO.

Each step samples `group_size` completions for each of `prompts_per_step` new prompts from the current model, keeps
the completions the verifier accepts (finished, `correctness_reward` = 1, each text once per prompt) and takes one
SFT step on them (`sft.sft_loss`, the same loop, schedule and checkpoints as `SFTTrainer`). A step whose samples are
all wrong trains on nothing. It is the control that asks whether a gain is GRPO's or only learning from the verifier
(RAFT, arXiv 2504.11343); the arc runs it for as long as GRPO trained (`RunConfig.rft_control`).

Under torchrun each process samples and checks its block of the prompts, and every process takes its block of the
rows all of them kept (`SFTTrainer._loss`): the step one process would take.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import Any

import torch

from ..data.rewards import correctness_reward
from ..engine.device import host_syncs_are_cheap, padded_rows, shard_batch
from ..engine.distributed import check_whole_groups, gather
from ..engine.sampler import Sampler, SamplerSettings
from .config import RFTConfig, RolloutSettings, RunConfig
from .sft import SFTTrainer, collate, encode_demonstrations


def accepted_completions(rows: list[dict[str, Any]], texts: list[str], *, finished: list[bool], right: list[float],
                         group_size: int) -> list[dict[str, Any]]:
    """The demonstrations RFT keeps from one rollout: `texts` holds `group_size` completions per row of `rows`, in
    order; a completion is kept when it `finished` (its stop token came before the length limit) and is `right`
    (its `correctness_reward`, 1 = right), and each distinct text once per prompt."""
    kept, seen = [], set()
    for i, (text, done, score) in enumerate(zip(texts, finished, right, strict=True)):
        row = rows[i // group_size]
        if done and score == 1.0 and (i // group_size, text) not in seen:
            seen.add((i // group_size, text))
            kept.append({"prompt": row["prompt"], "completion": text})
    return kept


def fixed_rows(batch: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """A `collate` batch of n ≤ `rows` accepted completions grown to `rows` rows: the extra rows repeat the first ones
    with no target tokens, so the loss (a mean over target tokens) and its gradient are the n rows'. On XLA the
    batch then keeps one shape from step to step (no recompiles) and splits evenly over an SPMD mesh."""
    n = batch["input_ids"].shape[0]
    if n >= rows:
        return batch
    fill = torch.arange(rows - n) % n
    grown = {k: torch.cat([v, v[fill]]) for k, v in batch.items()}
    grown["target_mask"][n:] = 0
    return grown


def rft_config(cfg: RunConfig, *, steps: int, output_dir: str | None) -> RFTConfig:
    """The RFT control's settings for run `cfg`: GRPO's learning rate (or `cfg.rft_learning_rate`), prompts per step,
    group size, temperature, completion length and seed; SFT's warm-up, weight decay, clipping, length and padding;
    `steps` steps, logged every step, checkpoints in `output_dir` (None: none)."""
    s, g = cfg.sft, cfg.grpo
    rollout = {f.name: getattr(g, f.name) for f in dataclasses.fields(RolloutSettings)}
    return RFTConfig(
        steps=steps, learning_rate=cfg.rft_learning_rate or g.learning_rate, weight_decay=s.weight_decay,
        warmup_steps=s.warmup_steps, max_grad_norm=s.max_grad_norm, max_length=s.max_length,
        pad_to_multiple_of=s.pad_to_multiple_of, log_every=1, seed=g.seed, save_every_seconds=s.save_every_seconds,
        output_dir=output_dir, report_to=s.report_to, **rollout,
    )


class RFTTrainer(SFTTrainer):
    """RFT from a prompt stream (rows with `prompt` and `answer`, e.g. `task.prompt_stream()`): `SFTTrainer`'s loop
    with batches sampled from the model and filtered by the verifier. Saves and resumes like SFT; the prompts
    already drawn are skipped on resume."""

    kind = "rft"
    metrics_file = "rft_metrics.jsonl"
    resume_settings = ("prompts_per_step", "group_size", "seed")

    def __init__(self, model: torch.nn.Module, tokenizer: Any, prompts: Iterable[dict[str, Any]],
                 config: RFTConfig | None = None, *, resume_metrics: bool = False) -> None:
        super().__init__(model, tokenizer, None, config or RFTConfig(), resume_metrics=resume_metrics)
        self.config: RFTConfig
        self.prompts = iter(prompts)
        self.prompts_drawn = 0
        """Prompts taken from the stream so far (a resumed run skips as many)."""
        cfg, splits = self.config, self.world.batch_world
        check_whole_groups(cfg.prompts_per_step, splits, setting="RFTConfig.prompts_per_step")
        self.sampler = Sampler(model, tokenizer, SamplerSettings(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, prompt_bucket=cfg.prompt_bucket,
        ), group_size=cfg.group_size, generator=self.generator, share=(splits.rank, splits.size))
        """Samples as GRPO's sampler does on this device (compiled where GRPO's is: `engine.sampler`); under torchrun
        this process's block of the prompts."""
        self._last = {"sampled_accuracy": 0.0, "accepted": 0}

    def _next_batch(self) -> dict[str, torch.Tensor] | None:
        cfg = self.config
        rows = [next(self.prompts) for _ in range(cfg.prompts_per_step)]
        self.prompts_drawn += len(rows)
        roll = self.sampler.generate([r["prompt"] for r in rows])  # this process's block of them
        block = rows[self.world.batch_world.block(len(rows))]
        texts, _, _ = roll.decoded(self.tokenizer)
        answers = [row["answer"] for row in block for _ in range(cfg.group_size)]
        right = correctness_reward([None] * len(texts), texts, answer=answers)
        kept = accepted_completions(block, texts, finished=(~roll.truncated.cpu()).tolist(), right=right,
                                    group_size=cfg.group_size)
        if self.world.batch_world.size > 1:  # every process trains on what all kept, in rank order
            parts = gather((kept, right), self.world.batch_world)
            kept, right = [k for p, _ in parts for k in p], [r for _, part in parts for r in part]
        self._last = {"sampled_accuracy": sum(right) / len(right), "accepted": len(kept)}
        if not kept:
            return None
        batch = collate(encode_demonstrations(self.tokenizer, kept, cfg.max_length), self.tokenizer.pad_token_id,
                        cfg.pad_to_multiple_of)
        if not host_syncs_are_cheap(self.device):  # XLA: one row count every step, split evenly over the mesh
            batch = fixed_rows(batch, padded_rows(cfg.prompts_per_step * cfg.group_size, self.device))
        return {k: shard_batch(v.to(self.device)) for k, v in batch.items()}

    def _batch_metrics(self) -> dict[str, Any]:
        return dict(self._last)

    def _position(self) -> dict[str, Any]:
        return {"prompts_drawn": self.prompts_drawn}

    def _resume_position(self, state: dict[str, Any]) -> None:
        self.prompts_drawn = state.get("prompts_drawn", 0)
        for _ in itertools.repeat(None, self.prompts_drawn):
            next(self.prompts)
