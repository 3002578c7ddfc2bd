"""SFT warm-up: completion-only cross-entropy on demonstrations rendered with the chat template.

Teaches the output format (and some of the skill) so that GRPO starts from a policy that sometimes
earns reward; without it a small model can sit at zero reward for hundreds of steps.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import get_cosine_schedule_with_warmup

from ..data.chat import turn_end
from ..data.tasks import check_no_overlap
from ..engine.decoder import final_softcap, supports
from ..engine.device import data_parallel_size, host_syncs_are_cheap, is_xla, mark_step, shard_batch
from ..engine.distributed import launched_size, sum_tensors
from ..engine.logprobs import ForwardOptions, HeadOptions, ProductPlan, completion_logprobs, token_logprobs_and_entropy
from ..engine.models import base_model
from ..engine.sampling import bucket_length, position_ids_from_mask, render_prompt
from ..engine.sharding import is_sharded, last_hidden_state
from ..validation import ConfigError, DataError, prompt_problem
from .config import FineTuneSettings, SFTConfig
from .loop import TrainingLoop
from .metrics import to_host


def encode_demonstrations(tokenizer: Any, rows: Any, max_length: int) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per row: chat-formatted prompt, then completion + the turn's end (`turn_end`:
    `<end_of_turn>`, Gemma 4's `<turn|>`)."""
    end = turn_end(tokenizer)
    examples = []
    for i, row in enumerate(rows):
        if "prompt" not in row or "completion" not in row:
            raise DataError(f"SFT row {i}: needs columns 'prompt' and 'completion', has {sorted(row)}")
        problem = prompt_problem(row["prompt"])
        if problem or not isinstance(row["completion"], str) or not row["completion"].strip():
            raise DataError(
                f"SFT row {i}: " + (f"'prompt' {problem}" if problem else "'completion' must be a non-empty string"))
        prompt = render_prompt(tokenizer, row["prompt"])
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        c = tokenizer(row["completion"] + end, add_special_tokens=False)["input_ids"]
        if len(p) + len(c) > max_length:
            raise DataError(
                f"SFT row {i}: {len(p) + len(c)} tokens exceed max_length={max_length}; raise it or shorten the row")
        examples.append((p + c, len(p)))
    if not examples:
        raise DataError("the SFT dataset is empty: it needs rows with 'prompt' and 'completion' columns")
    return examples


def collate(examples: list[tuple[list[int], int]], pad_id: int, bucket: int) -> dict[str, torch.Tensor]:
    """Left-pad to a bucket length. Returns input_ids, attention_mask (B, L) and target_mask (B, L−1):
    1 where the next token is a completion token (the loss is on the completion only)."""
    width = bucket_length(max(len(ids) for ids, _ in examples), bucket)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    target = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (seq, plen) in enumerate(examples):
        start = width - len(seq)
        ids[row, start:] = torch.tensor(seq)
        attn[row, start:] = 1
        target[row, start + plen :] = 1
    return {"input_ids": ids, "attention_mask": attn, "target_mask": target[:, 1:]}


def split_prompts(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A `collate` batch laid out as GRPO's rollouts are, (B, P + N): each prompt left-padded to P (the longest
    prompt), its completion from column P on, right-padded to N (the longest completion). Returns (input_ids,
    attention_mask, P); padding ids are 0 and masked. Reads the masks on the host."""
    ids, attn, target = batch["input_ids"], batch["attention_mask"], batch["target_mask"]
    width = ids.shape[1]
    starts = attn.argmax(1).tolist()  # first real token (rows are left-padded)
    firsts = (target.argmax(1) + 1).tolist()  # first completion token (target_mask[t]: token t + 1 is one)
    prompt_len = max(f - s for s, f in zip(starts, firsts, strict=True))
    total = prompt_len + max(width - f for f in firsts)
    out, mask = ids.new_zeros((ids.shape[0], total)), attn.new_zeros((ids.shape[0], total))
    for row, (start, first) in enumerate(zip(starts, firsts, strict=True)):
        out[row, prompt_len - (first - start) : prompt_len] = ids[row, start:first]
        out[row, prompt_len : prompt_len + width - first] = ids[row, first:]
        mask[row, prompt_len - (first - start) : prompt_len + width - first] = 1
    return out, mask, prompt_len


def sft_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], *, completion_only_head: bool | None = None,
             padding_free: bool = False, products: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean negative log-likelihood of completion tokens: −Σ m log π(y_t | y_<t) / Σ m. Returns (loss, tokens).

    `completion_only_head` (default: off XLA) runs the LM head only at the completion positions — with Gemma's
    262k-entry vocabulary the head costs more than the body, and prompt and padding positions are about half of
    each row; the same loss up to float order. XLA keeps the padded shape (a fixed graph per bucket).

    `padding_free` (Gemma on cpu/cuda; `SFTConfig.padding_free`) runs the forward GRPO's update runs
    (`logprobs.completion_logprobs` on `split_prompts`' layout): the real tokens only, and with `products` (bf16
    on a CPU with native bf16 products; `SFTConfig.cpu_bf16`) the frozen base weights multiplied in that dtype.
    The same loss up to float order, and bf16 rounding with `products`."""
    hf = base_model(model)
    ids, attn = batch["input_ids"], batch["attention_mask"]
    sharded = is_sharded(hf)  # weights sharded over processes: the model's own forward gathers each layer
    if padding_free and supports(hf) and host_syncs_are_cheap(ids.device) and not sharded:
        ids, attn, prompt_len = split_prompts(batch)
        logp, _ = completion_logprobs(model, ids, attn, prompt_len,
                                      forward=ForwardOptions(padding_free=True, product_dtype=products),
                                      head=HeadOptions(entropy_grad=False))
        mask = attn[:, prompt_len:].to(logp.dtype)
        tokens = mask.sum()
        return -(logp * mask).sum() / tokens.clamp(min=1), tokens
    if sharded:
        hidden = last_hidden_state(hf, ids, attn, position_ids_from_mask(attn))
    else:
        hidden = hf.model(
            input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn), use_cache=False
        ).last_hidden_state
    hidden, targets, mask = hidden[:, :-1], ids[:, 1:], batch["target_mask"]
    if completion_only_head is None:
        completion_only_head = hidden.device.type != "xla"
    if completion_only_head:
        keep = mask.bool()
        hidden, targets, mask = hidden[keep].unsqueeze(0), targets[keep].unsqueeze(0), mask[keep].unsqueeze(0)
    logp, _ = token_logprobs_and_entropy(hidden, hf.lm_head.weight, targets, softcap=final_softcap(hf),
                                         options=HeadOptions(with_entropy=False, entropy_grad=False))
    mask = mask.to(logp.dtype)
    tokens = mask.sum()
    return -(logp * mask).sum() / tokens.clamp(min=1), tokens


class SFTTrainer(TrainingLoop):
    """Fixed-shape batches (batch_size × bucketed length), AdamW with warm-up + cosine decay. Saves
    `output_dir/checkpoint` as it goes (`save_every`, `save_every_seconds`); `load` continues a run from one
    exactly as if it had not stopped (same batches, same schedule). `resume_metrics` keeps `sft_metrics.jsonl`.
    `rft.RFTTrainer` runs the same loop on batches it samples (`_next_batch`). The optimizer, checkpoints, skip
    guard and loop are `loop.TrainingLoop`'s."""

    kind = "sft"
    metrics_file = "sft_metrics.jsonl"
    resume_settings: tuple[str, ...] = ("batch_size", "seed")
    """Settings a resumed run must share with its checkpoint (else it would see other batches)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, dataset: Any,
                 config: SFTConfig | FineTuneSettings | None = None,
                 *, resume_metrics: bool = False) -> None:
        cfg = config or SFTConfig()
        self.tokenizer = tokenizer
        self.examples = encode_demonstrations(tokenizer, dataset, cfg.max_length) if dataset is not None else []
        if dataset is not None:  # demonstrations in batches (RFT's batches are what its sampler accepts)
            check_no_overlap((row["prompt"] for row in dataset), where="the SFT dataset")
            self._check_batch_size(model, cfg.batch_size)
        self._start_loop(model, cfg, resume_metrics=resume_metrics)
        # the dtype GRPO's update multiplies the frozen weights in (bf16 on a CPU with native bf16 products)
        self.products = ProductPlan(reuse_sampler_head=False, bf16_products=cfg.cpu_bf16 is not False
                                    ).update_product_dtype(model)
        self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, cfg.warmup_steps, cfg.steps)
        self._order: list[int] = []

    def _check_batch_size(self, model: torch.nn.Module, batch_size: int) -> None:
        if len(self.examples) < batch_size:
            raise ValueError(f"SFT: {len(self.examples)} demonstrations, fewer than batch_size={batch_size}")
        if batch_size < launched_size():
            raise ConfigError(f"SFTConfig.batch_size={batch_size} gives some of the {launched_size()} processes "
                              f"(torchrun --nproc-per-node) no rows: make it at least {launched_size()}")
        devices = data_parallel_size() if is_xla(next(model.parameters()).device) else 1
        if batch_size % devices:
            raise ConfigError(
                f"SFTConfig.batch_size={batch_size} cannot be split over the {devices} devices of the SPMD "
                f"mesh: make it a multiple of {devices}"
            )

    def _next_batch(self) -> dict[str, torch.Tensor] | None:
        """The next batch of demonstrations, on the device (None: nothing to train on this step)."""
        if len(self._order) < self.config.batch_size:
            self._order += torch.randperm(len(self.examples), generator=self.generator).tolist()
        picked, self._order = self._order[: self.config.batch_size], self._order[self.config.batch_size :]
        batch = collate([self.examples[i] for i in picked], self.tokenizer.pad_token_id, self.config.pad_to_multiple_of)
        # under SPMD each device takes its share of the rows (data parallel), as GRPO's batches do
        return {k: shard_batch(v.to(self.device)) for k, v in batch.items()}

    def train_step(self) -> dict[str, Any]:
        start = time.perf_counter()
        self.model.train()
        batch = self._next_batch()
        stats: dict[str, Any] = {"tokens": 0}
        if batch is not None:
            loss, tokens = self._loss(batch)
            loss.backward()
            grad_norm, skipped = self._optimizer_step(loss.detach())
            loss = sum_tensors([loss.detach()], self.world.batch_world)[0]  # the whole batch's mean
            stats = {"loss": loss, "grad_norm": grad_norm, "tokens": tokens, "skipped_updates": skipped}
        self._advance_schedule(1)
        mark_step(self.device)
        self.step += 1
        row = to_host(stats)
        row.update(self._batch_metrics())
        row.update(
            step=self.step, learning_rate=self.scheduler.get_last_lr()[0], step_seconds=time.perf_counter() - start
        )
        self._count_step_seconds(row["step_seconds"])
        self._count_skipped(row)
        return row

    def _loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(`sft_loss` of the batch, its completion tokens). Under torchrun each process takes its block of the rows
        and returns its share of the whole batch's mean (its tokens' sum over all processes' tokens), so the summed
        gradients are the whole batch's, and the whole batch's token count. A process whose block is empty (a batch
        of fewer rows than processes) returns a zero share and a zero gradient."""
        options = {"padding_free": self.config.padding_free is not False, "products": self.products}
        if self.world.batch_world.size == 1:
            return sft_loss(self.model, batch, **options)
        rows = self.world.batch_world.block(batch["input_ids"].shape[0])
        if rows.stop > rows.start:
            loss, tokens = sft_loss(self.model, {k: v[rows] for k, v in batch.items()}, **options)
        else:  # fewer rows than processes (RFT can keep a single completion): a row that weighs nothing, since with
            # sharded weights every process must run the forward and backward (each gathers every layer)
            loss, tokens = sft_loss(self.model, {k: v[:1] for k, v in batch.items()}, **options)
            loss, tokens = loss * 0, tokens * 0
        total = sum_tensors([tokens.detach()], self.world.batch_world)[0]
        return loss * tokens / total.clamp(min=1), total

    def _batch_metrics(self) -> dict[str, Any]:
        """Metrics of the batch just trained on, beyond the loss (RFT: what was sampled and kept)."""
        return {}

    def set_steps(self, steps: int) -> None:
        """Change the run's length mid-run (a time budget sizes it from measured step times): the cosine schedule
        is rebuilt over the new total and continues from the current step."""
        if steps < self.step:
            raise ValueError(f"SFT: cannot shorten the run to {steps} steps, {self.step} are done")
        self.config = dataclasses.replace(self.config, steps=steps)
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        self.scheduler = get_cosine_schedule_with_warmup(self.optimizer, self.config.warmup_steps, steps)
        self._advance_schedule(self.step)

    def _advance_schedule(self, steps: int) -> None:
        with warnings.catch_warnings():  # a step with nothing to train on (RFT) still moves the schedule on
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            for _ in range(steps):
                self.scheduler.step()

    def train(self, progress: bool = True, steps: int | None = None) -> list[dict[str, Any]]:
        """Train until `steps` (default config.steps) steps are done, or max_seconds has passed."""
        target = self.config.steps if steps is None else min(steps, self.config.steps)
        return self._run(target, progress=progress, after_step=self._log_and_save)

    def _log_and_save(self, row: dict[str, Any]) -> None:
        """A metrics row every `log_every` steps and at the last; a checkpoint when due (the caller saves the
        finished run)."""
        cfg = self.config
        if self.step % cfg.log_every == 0 or self.step == cfg.steps:
            self.logger.log(row)
        if self.checkpoint_path is not None and self._save_due() and self.step < cfg.steps:
            self.save(self.checkpoint_path)

    def _progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        return {"loss": f"{row['loss']:.3f}"} if "loss" in row else {}

    def save(self, path: str | Path) -> Path:
        """Weights (or adapter), optimizer, learning-rate schedule, batch order, RNG states, step and settings."""
        return self._save(path, {"config": dataclasses.asdict(self.config), "scheduler": self.scheduler.state_dict(),
                                 **self._position()})

    def load(self, path: str | Path) -> None:
        """Resume: weights, optimizer, schedule, batch order and step; metrics rows after that step are dropped.
        Refuses a checkpoint whose batch settings differ (the resumed run would see different batches)."""
        state = self._restore(path)
        if "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        self._resume_position(state)

    def _position(self) -> dict[str, Any]:
        """Where the run is in its data, saved with each checkpoint: the batch order still to come."""
        return {"batch_order": self._order}

    def _resume_position(self, state: dict[str, Any]) -> None:
        self._order = list(state.get("batch_order", []))
